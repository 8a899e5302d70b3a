/* SPDX-License-Identifier: MIT */
/*
 * attention_ref_backward.h — the fp64 naive reference for the backward pass (dq, dk, dv), with
 * every feature of the forward including dropout. Like attention_ref.h it is obviously correct
 * rather than fast and follows the semantics of ../../include/flashattn.h literally; it shares
 * only ref_problem and ref_visible with attention_ref.c (its forward part is written again here,
 * so the two forwards check each other).
 *
 * Tensors are contiguous, in logical order:
 *   q, out, dout, dq   (B, Sq, H, D)
 *   k, v, dk, dv       (B, Sk, Hk, D)
 *   lse                (B, H, Sq), natural log
 * Dropout comes from the ref_problem: dropout_mask (B, H, Sq, Sk) uint8, nonzero = kept (as
 * fa_dropout_mask writes it), and dropout_p; dropout_mask NULL = no dropout.
 *
 * For each (batch b, query head h, query row i), over the keys j visible to i:
 *   s_j  = score (x_j = scale·q·k_j; softcap c·tanh(x_j/c); ALiBi −slope·|i + Sk − Sq − j|)
 *   P_j  = exp(s_j − lse),  lse = log Σ_j exp(s_j)         (dropout does not change lse)
 *   Pd_j = P_j · M_ij / (1 − p)                             (the dropped probabilities)
 *   O    = Σ_j Pd_j v_j
 *   dV_j += Pd_j dO                                          (dV = Pdᵀ dO)
 *   dP_j = (dO · v_j) · M_ij / (1 − p)                       (dP = (dO Vᵀ)∘M/(1−p))
 *   Δ    = dO · O                                            (rowsum(dO∘O))
 *   dS_j = P_j (dP_j − Δ),  times 1 − tanh²(x_j / c) with softcap
 *   dQ  += scale · dS_j k_j,   dK_j += scale · dS_j q        (dK, dV summed over the query heads
 *                                                            that share a KV head)
 * A row with no visible key (or Sk = 0) has out = 0, lse = −inf and contributes nothing.
 */
#ifndef FA_ATTENTION_REF_BACKWARD_H
#define FA_ATTENTION_REF_BACKWARD_H

#include <stdint.h>

#include "attention_ref.h"

/* Backward in fp64: the gradients dq, dk, dv of L = Σ out∘dout. It computes the forward's out
 * and lse on the way and returns them too. Any of out, lse, dq, dk, dv may be NULL (not
 * wanted); dout NULL computes only out and lse. */
void ref_attention_backward(const ref_problem *p, const double *q, const double *k, const double *v,
                            const double *dout, double *out, double *lse, double *dq, double *dk,
                            double *dv);

/* The same computed the way a naive implementation in a low-precision dtype would (the
 * yardstick for fp16/bf16, DESIGN.md §9): every intermediate tensor is rounded with round_fn —
 * the scores at each step as in ref_attention_forward_rounded, P, Pd, O, dO·Vᵀ, dP, Δ, dP − Δ,
 * dS (and 1 − tanh² and its product with softcap), each per-head matmul result dS·K, dSᵀ·Q,
 * Pdᵀ·dO and its scaling, and the sum over the query heads of a KV head — while every reduction
 * (dot product, softmax sum, matmul) is accumulated exactly, as an fp32-accumulating kernel
 * would. Inputs are used as given (round them to the dtype first). lse is the fp64 logsumexp
 * of the rounded scores. round_fn NULL = no rounding (then equal to ref_attention_backward). */
void ref_attention_backward_rounded(const ref_problem *p, const double *q, const double *k,
                                    const double *v, const double *dout, double *out, double *lse,
                                    double *dq, double *dk, double *dv, double (*round_fn)(double));

/* The gradients as a backward that is handed the forward's output computes them: identical to
 * ref_attention_backward except that Δ = rowsum(dO∘O) is taken with the given out (B, Sq, H, D)
 * instead of the exact one. fa_backward takes out as the forward stored it — in fp16/bf16,
 * rounded — so this is the exact function of fa_backward's actual inputs; the difference from
 * ref_attention_backward is what storing out in the dtype costs, which no backward given that
 * out can undo. */
void ref_attention_backward_given_out(const ref_problem *p, const double *q, const double *k,
                                      const double *v, const double *out, const double *dout,
                                      double *dq, double *dk, double *dv);

/* ref_attention_backward_given_out with dS and Pd rounded by round_fn where they enter the dQ,
 * dK and dV sums, and nothing else: the exact gradient of the backward's actual inputs for a
 * backward that multiplies dS and Pd in a low-precision dtype, as flash-attn's kernels and this
 * library's bf16 dot-product kernels do. round_fn NULL = no rounding. */
void ref_attention_backward_given_out_operands(const ref_problem *p, const double *q,
                                               const double *k, const double *v, const double *out,
                                               const double *dout, double *dq, double *dk,
                                               double *dv, double (*round_fn)(double));

/* The scale of each gradient element for floating-point error bounds: the same sums as
 * ref_attention_backward with every term replaced by its absolute value —
 *   |dP|_j = Σ_d |dO_d v_jd|·M_ij/(1 − p),  |Δ| = Σ_d |dO_d O_d|,
 *   |dS|_j = P_j (|dP|_j + |Δ|) (· (1 − tanh²) with softcap),
 *   dq: |scale| Σ_j |dS|_j |k_j|,  dk: |scale| Σ_i |dS|_ij |q_i|,  dv: Σ_i Pd_ij |dO_i|.
 * An implementation that accumulates with unit roundoff u has errors of order u times these
 * (a small multiple of u with blocked sums), even where cancellation makes the gradient itself
 * (nearly) zero, e.g. for a row that sees a single key, whose dS is exactly 0. */
void ref_attention_backward_bound(const ref_problem *p, const double *q, const double *k,
                                  const double *v, const double *dout, double *dq, double *dk,
                                  double *dv);

#endif /* FA_ATTENTION_REF_BACKWARD_H */
