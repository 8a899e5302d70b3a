/* SPDX-License-Identifier: MIT */
/*
 * hd.h — FA_HD marks a function defined in a header as callable from host code and from CUDA
 * device code alike, so the C library and the CUDA plug-in compile the same source (philox.h,
 * convert.h, cuda/fwd_row.h). In C it is plain `static inline`.
 */
#ifndef FA_HD_H
#define FA_HD_H

#if defined(__CUDACC__)
#define FA_HD __host__ __device__ __forceinline__
#else
#define FA_HD static inline
#endif

#endif /* FA_HD_H */
