/* SPDX-License-Identifier: MIT */
/*
 * tools/probe/ — the environment probes: what the machine has (driver and GPUs, compilers and
 * nvcc, Python and torch, glibc), read by `doctor` and `wheel`.
 *
 * pyprobe.c — Python, PyTorch and flash_attn, as seen by running the interpreter the user
 * would run (python3, then python, on PATH; or --python / FLASHATTN_DOCTOR_PYTHON). A short
 * script prints one "FA_key=value" line per fact; every step is in its own try block, so a
 * broken torch still reports the Python facts, and a missing or crashing interpreter, a
 * timeout or garbage output are all recorded rather than fatal.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envprobe.h"
#include "runcmd.h"

/* Every value on one line: backslashes and newlines escaped. */
static const char PROBE[] =
    "import sys, os\n"
    "cwd = os.getcwd()\n"
    "sys.path = [p for p in sys.path if p not in ('', '.', cwd)]  # installed packages only\n"
    "def out(k, v):\n"
    "    v = str(v).replace('\\\\', '\\\\\\\\').replace('\\n', '\\\\n').replace('\\r', '')\n"
    "    sys.stdout.write('FA_%s=%s\\n' % (k, v))\n"
    "    sys.stdout.flush()\n"
    "out('python_version', '%d.%d.%d' % tuple(sys.version_info[:3]))\n"
    "out('python_tag', 'cp%d%d' % tuple(sys.version_info[:2]))\n"
    "out('python_minor', sys.version_info[1])\n"
    "out('executable', sys.executable)\n"
    "try:\n"
    "    import sysconfig, platform\n"
    "    out('soabi', sysconfig.get_config_var('SOABI'))\n"
    "    out('machine', platform.machine())\n"
    "except Exception as e:\n"
    "    pass\n"
    "import importlib.util\n"
    "for m in ('packaging', 'ninja', 'psutil', 'wheel', 'setuptools', 'einops'):\n"
    "    try:\n"
    "        out('has_' + m, 1 if importlib.util.find_spec(m) else 0)\n"
    "    except Exception:\n"
    "        out('has_' + m, 0)\n"
    "try:\n"
    "    import importlib.metadata as md\n"
    "    for d in ('flash_attn', 'triton'):\n"
    "        try:\n"
    "            out('dist_' + d, md.version(d))\n"
    "        except Exception:\n"
    "            pass\n"
    "except Exception:\n"
    "    pass\n"
    "try:\n"
    "    import torch\n"
    "    out('torch_version', torch.__version__)\n"
    "    out('torch_lib', os.path.join(os.path.dirname(torch.__file__), 'lib'))\n"
    "    out('torch_cuda', torch.version.cuda)\n"
    "    out('torch_hip', getattr(torch.version, 'hip', None))\n"
    "    out('torch_cxx11abi', torch._C._GLIBCXX_USE_CXX11_ABI)\n"
    "    try:\n"
    "        out('torch_cuda_available', torch.cuda.is_available())\n"
    "        out('torch_arch_list', ' '.join(torch.cuda.get_arch_list()))\n"
    "    except BaseException as e:\n"
    "        out('torch_cuda_error', '%s: %s' % (type(e).__name__, e))\n"
    "except BaseException as e:\n"
    "    out('torch_error', '%s: %s' % (type(e).__name__, e))\n"
    "try:\n"
    "    s = importlib.util.find_spec('flash_attn_2_cuda')\n"
    "    if s is not None and s.origin:\n"
    "        out('fa_ext_path', s.origin)\n"
    "except BaseException:\n"
    "    pass\n"
    "try:\n"
    "    s = importlib.util.find_spec('flash_attn')\n"
    "except BaseException:\n"
    "    s = None\n"
    "if s is not None:\n"
    "    out('fa_path', s.origin)\n"
    "    try:\n"
    "        import flash_attn\n"
    "        out('fa_version', getattr(flash_attn, '__version__', '?'))\n"
    "        out('fa_import', 'ok')\n"
    "    except BaseException as e:\n"
    "        out('fa_import_error', '%s: %s' % (type(e).__name__, e))\n"
    "    try:\n"
    "        import flash_attn_2_cuda\n"
    "        out('fa_ext_import', 'ok')\n"
    "    except BaseException as e:\n"
    "        out('fa_ext_error', '%s: %s' % (type(e).__name__, e))\n"
    "out('done', 1)\n";

static void set(char *dst, unsigned cap, const char *v) { env_copy(dst, cap, v); }

static int truthy(const char *v) { return !strcmp(v, "True") || !strcmp(v, "1"); }

static void parse_line(env_python *p, const char *key, const char *v) {
    if (!strcmp(key, "python_version"))
        set(p->version, sizeof p->version, v);
    else if (!strcmp(key, "python_tag"))
        set(p->tag, sizeof p->tag, v);
    else if (!strcmp(key, "python_minor"))
        p->minor = atoi(v);
    else if (!strcmp(key, "soabi"))
        set(p->soabi, sizeof p->soabi, v);
    else if (!strcmp(key, "machine"))
        set(p->machine, sizeof p->machine, v);
    else if (!strcmp(key, "has_packaging"))
        p->has_packaging = truthy(v);
    else if (!strcmp(key, "has_ninja"))
        p->has_ninja = truthy(v);
    else if (!strcmp(key, "has_psutil"))
        p->has_psutil = truthy(v);
    else if (!strcmp(key, "has_wheel"))
        p->has_wheel = truthy(v);
    else if (!strcmp(key, "has_setuptools"))
        p->has_setuptools = truthy(v);
    else if (!strcmp(key, "has_einops"))
        p->has_einops = truthy(v);
    else if (!strcmp(key, "dist_triton"))
        set(p->triton_version, sizeof p->triton_version, v);
    else if (!strcmp(key, "dist_flash_attn"))
        set(p->fa_dist_version, sizeof p->fa_dist_version, v);
    else if (!strcmp(key, "torch_version")) {
        p->torch_present = 1;
        set(p->torch_version, sizeof p->torch_version, v);
    } else if (!strcmp(key, "torch_lib"))
        set(p->torch_lib, sizeof p->torch_lib, v);
    else if (!strcmp(key, "torch_cuda"))
        set(p->torch_cuda, sizeof p->torch_cuda, v);
    else if (!strcmp(key, "torch_hip"))
        set(p->torch_hip, sizeof p->torch_hip, v);
    else if (!strcmp(key, "torch_cxx11abi"))
        p->torch_abi = truthy(v) ? 1 : !strcmp(v, "False") || !strcmp(v, "0") ? 0 : -1;
    else if (!strcmp(key, "torch_cuda_available"))
        p->torch_cuda_available = truthy(v);
    else if (!strcmp(key, "torch_arch_list"))
        set(p->torch_arch_list, sizeof p->torch_arch_list, v);
    else if (!strcmp(key, "torch_cuda_error"))
        set(p->torch_cuda_error, sizeof p->torch_cuda_error, v);
    else if (!strcmp(key, "torch_error"))
        set(p->torch_error, sizeof p->torch_error, v);
    else if (!strcmp(key, "fa_ext_path"))
        set(p->fa_ext_path, sizeof p->fa_ext_path, v);
    else if (!strcmp(key, "fa_path")) {
        p->fa_present = 1;
        set(p->fa_path, sizeof p->fa_path, v);
    } else if (!strcmp(key, "fa_version"))
        set(p->fa_version, sizeof p->fa_version, v);
    else if (!strcmp(key, "fa_import"))
        p->fa_import_ok = 1;
    else if (!strcmp(key, "fa_import_error"))
        set(p->fa_import_error, sizeof p->fa_import_error, v);
    else if (!strcmp(key, "fa_ext_import"))
        p->fa_ext_import_ok = 1;
    else if (!strcmp(key, "fa_ext_error"))
        set(p->fa_ext_error, sizeof p->fa_ext_error, v);
    else if (!strcmp(key, "done"))
        p->ok = 1;
}

void probe_python(env_python *p, const env_options *o) {
    const char *env = getenv("FLASHATTN_DOCTOR_PYTHON");
    const char *want = o && o->python ? o->python : (env && *env ? env : NULL);
    const char *argv[4];
    char *found = NULL;
    run_result r;
    double timeout = o && o->timeout_s > 0 ? o->timeout_s : 60.0;
    char *line, *save = NULL;

    memset(p, 0, sizeof *p);
    p->torch_abi = -1;
    p->torch_cuda_available = -1;
    if (o && o->skip_python)
        return;
    if (want) {
        found = path_find(want);
        if (!found) {
            set(p->path, sizeof p->path, want);
            snprintf(p->error, sizeof p->error, "%.400s: not found or not executable", want);
            return;
        }
    } else {
        found = path_find("python3");
        if (!found)
            found = path_find("python");
        if (!found)
            return;
    }
    p->found = 1;
    set(p->path, sizeof p->path, found);
    argv[0] = found;
    argv[1] = "-c";
    argv[2] = PROBE;
    argv[3] = NULL;
    if (run_capture(argv, timeout, 1 << 18, &r) != 0) {
        free(found);
        set(p->error, sizeof p->error, "could not start the interpreter (out of resources)");
        return;
    }
    free(found);
    p->ran = r.started;
    p->timed_out = r.timed_out;
    p->exit_code = r.exited ? r.exit_code : -1;
    p->signal = r.signal;
    for (line = strtok_r(r.out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq;
        if (strncmp(line, "FA_", 3) != 0 || !(eq = strchr(line, '=')))
            continue;
        *eq = '\0';
        parse_line(p, line + 3, eq + 1);
    }
    if (!r.started) {
        snprintf(p->error, sizeof p->error, "%.400s could not be executed", p->path);
    } else if (r.timed_out) {
        snprintf(p->error, sizeof p->error, "no answer within %.0f s (killed)", timeout);
        p->ok = 0;
    } else if (!p->ok) {
        char last[400] = "";
        /* the last non-empty line of stderr is where Python says what went wrong */
        const char *e = r.err, *best = NULL;
        while (e && *e) {
            size_t n = strcspn(e, "\n");
            if (n > 0)
                best = e;
            e += n;
            if (*e)
                e++;
        }
        if (best)
            first_line(best, last, sizeof last);
        if (r.signal)
            snprintf(p->error, sizeof p->error, "killed by signal %d%s%.300s", r.signal,
                     last[0] ? ": " : "", last);
        else if (!p->version[0])
            snprintf(p->error, sizeof p->error, "exit status %d, no answer%s%.300s", p->exit_code,
                     last[0] ? ": " : "", last);
        else
            snprintf(p->error, sizeof p->error, "stopped early (exit status %d)%s%.300s",
                     p->exit_code, last[0] ? ": " : "", last);
    }
    run_free(&r);
}
