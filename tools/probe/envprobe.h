/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * envprobe.h — what the doctor and the wheel command know about this machine, gathered without
 * network access: CPU and memory (sysprobe.c), the NVIDIA driver and GPUs through the driver
 * library loaded at run time (driver.c), the CUDA toolkit and the host compilers (toolprobe.c),
 * glibc and libstdc++ (sysprobe.c), and Python, PyTorch and flash_attn by running the
 * interpreter (pyprobe.c). Nothing here judges; doctor.c turns facts into findings.
 *
 * Tests build fake environments through these variables (all optional):
 *   FLASHATTN_DOCTOR_LIBCUDA   driver library to dlopen instead of libcuda.so.1 ("none": absent)
 *   FLASHATTN_DOCTOR_LIBNVML   NVML library (default: the LIBCUDA file when that is set, else
 *                              libnvidia-ml.so.1)
 *   FLASHATTN_DOCTOR_PYTHON    the interpreter to run (default: python3, then python, on PATH)
 *   FLASHATTN_DOCTOR_TIMEOUT   seconds the interpreter may take (default 60)
 *   FLASHATTN_DOCTOR_MEM_GB    available RAM in GB instead of /proc/meminfo and the cgroup limit
 *   FLASHATTN_DOCTOR_NCPU      CPU count instead of sysconf
 *   FLASHATTN_DOCTOR_GLIBC     glibc version instead of confstr ("2.31")
 *   FLASHATTN_DOCTOR_LIBSTDCXX libstdc++ file to read instead of the one dlopen finds ("none")
 *   FLASHATTN_DOCTOR_DEFAULT_CUDA  the fallback toolkit directory instead of /usr/local/cuda
 *                              ("none": no fallback)
 */
#ifndef FA_TOOLS_ENVPROBE_H
#define FA_TOOLS_ENVPROBE_H

#define ENV_MAX_GPUS 16
#define ENV_PATH_LEN 512

typedef struct env_cpu {
    char arch[32];   /* uname -m */
    char model[160]; /* "Intel(R) Xeon(R) ..." */
    int ncpu;        /* CPUs online (or FLASHATTN_DOCTOR_NCPU) */
    char simd[256];  /* "sse4_2 avx avx2 fma avx512f ..." */
} env_cpu;

typedef struct env_mem {
    double total_gb;  /* MemTotal */
    double avail_gb;  /* MemAvailable */
    double cgroup_gb; /* cgroup memory limit, 0 if none */
    double build_gb;  /* what a build may use: min(available, cgroup limit) */
    char source[64];
} env_mem;

typedef struct env_gpu {
    char name[128];
    int cc_major, cc_minor;
    double mem_gb;
} env_gpu;

typedef struct env_driver {
    int found;              /* the driver library loaded */
    char lib[ENV_PATH_LEN]; /* what was asked for, and where it came from */
    char error[256];        /* dlerror() or the failed call */
    int init_rc;            /* cuInit's CUresult (0 ok) */
    char init_name[64];     /* "CUDA_ERROR_NO_DEVICE" */
    int cuda_version;       /* cuDriverGetVersion: 12040 = 12.4; 0 unknown */
    char version[64];       /* NVML driver version "550.54.15", "" unknown */
    int ngpus;
    env_gpu gpus[ENV_MAX_GPUS];
} env_driver;

typedef struct env_tool {
    int found; /* on PATH / at the path */
    char path[ENV_PATH_LEN];
    int ran;          /* it answered --version */
    char version[64]; /* "13.0", "12.2.0" */
    int major, minor;
    char line[256]; /* the identifying line of its --version output */
    char error[256];
} env_tool;

typedef struct env_cuda {
    char cuda_home_env[ENV_PATH_LEN]; /* $CUDA_HOME, "" if unset */
    char cuda_path_env[ENV_PATH_LEN]; /* $CUDA_PATH */
    char home[ENV_PATH_LEN];          /* the toolkit torch's cpp_extension would use */
    char home_source[64];             /* "CUDA_HOME", "CUDA_PATH", "nvcc on PATH", "default" */
    int home_exists;
    env_tool nvcc;      /* nvcc found on PATH */
    env_tool home_nvcc; /* $home/bin/nvcc */
    int headers_checked;
    char missing_headers[256]; /* of cuda_runtime.h cublas_v2.h cusparse.h cusolverDn.h */
    int host_gcc_max;          /* "#if __GNUC__ > N" in crt/host_config.h, 0 unknown */
    char host_config[ENV_PATH_LEN];
} env_cuda;

typedef struct env_cxx {
    env_tool gcc, gxx;
    char other_gcc[128]; /* gcc-N versions on PATH: "gcc-11 gcc-12" */
} env_cxx;

typedef struct env_libc {
    char glibc[32];               /* "2.36" */
    char libstdcxx[ENV_PATH_LEN]; /* the libstdc++.so.6 the system loader finds */
    char glibcxx_max[32];         /* "GLIBCXX_3.4.30" */
    char cxxabi_max[32];          /* "CXXABI_1.3.13" */
    char libstdcxx_error[256];
    char conda_libstdcxx[ENV_PATH_LEN]; /* $CONDA_PREFIX/lib/libstdc++.so.6 if there */
    char conda_glibcxx_max[32];
} env_libc;

typedef struct env_python {
    int found; /* an interpreter was found */
    char path[ENV_PATH_LEN];
    int ran, ok; /* it ran; it printed the probe's answers */
    int timed_out, exit_code, signal;
    char error[512];  /* first line of what went wrong */
    char version[32]; /* "3.11.7" */
    char tag[16];     /* "cp311" */
    int minor;        /* 11 */
    char soabi[64];
    char machine[32];
    int has_packaging, has_ninja, has_psutil, has_wheel, has_setuptools, has_einops;
    char triton_version[32];
    /* torch */
    int torch_present;
    char torch_version[64]; /* "2.8.0+cu128" */
    char torch_cuda[32];    /* "12.8", "None" */
    char torch_hip[32];
    int torch_abi;            /* _GLIBCXX_USE_CXX11_ABI: 1, 0, -1 unknown */
    int torch_cuda_available; /* 1, 0, -1 unknown */
    char torch_error[512];
    char torch_cuda_error[256];
    char torch_lib[ENV_PATH_LEN]; /* .../site-packages/torch/lib */
    char torch_arch_list[256];
    /* flash_attn */
    int fa_present; /* importlib finds flash_attn */
    char fa_version[64];
    char fa_dist_version[64];
    char fa_path[ENV_PATH_LEN];
    char fa_ext_path[ENV_PATH_LEN]; /* flash_attn_2_cuda*.so */
    int fa_import_ok;
    char fa_import_error[1024];
    int fa_ext_import_ok;
    char fa_ext_error[1024];
} env_python;

typedef struct fa_env {
    env_cpu cpu;
    env_mem mem;
    env_driver drv;
    env_cuda cuda;
    env_cxx cxx;
    env_libc libc;
    env_python py;
} fa_env;

typedef struct env_options {
    const char *python; /* interpreter to run, or NULL for the default */
    int skip_python;    /* do not run Python at all */
    double timeout_s;   /* for the interpreter (other tools get min(this, 20 s)) */
} env_options;

/* Fills *e (everything zeroed first). Never fails: what cannot be found is recorded. */
void env_probe(fa_env *e, const env_options *o);

/* The pieces (envprobe.c calls them in order). */
void probe_cpu(env_cpu *c);
void probe_mem(env_mem *m);
void probe_libc(env_libc *l);
void probe_driver(env_driver *d);
void probe_cuda(env_cuda *c, double timeout_s);
void probe_cxx(env_cxx *x, double timeout_s);
void probe_python(env_python *p, const env_options *o);

/* Helpers shared by the probes and the checks. */
/* "12.4" from a driver version number 12040. */
void env_cuda_version_str(int v, char *buf, unsigned cap);
/* Parses "X.Y..." into major/minor; 0 on success. */
int env_parse_mm(const char *s, int *major, int *minor);
/* Copies at most cap-1 bytes and terminates. */
void env_copy(char *dst, unsigned cap, const char *src);

#endif /* FA_TOOLS_ENVPROBE_H */
