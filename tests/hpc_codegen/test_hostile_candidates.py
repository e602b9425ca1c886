"""Hostile candidates against the verdicts (hpc_codegen/harness.py, reference.py).

Each candidate tries one way to pass without being right, or to be timed faster than it is:
tamper with what checks it (the suite's drivers, the trusted runner and reference program,
the baseline's outputs), forge a verdict (print pass lines, read the command line, write its
own output file and leave), forge the timing (its own end mark, a late start mark), reuse an
earlier run's answer, include a host file into a compiler message, and fork without end.
Every such candidate returns the right answer *only if its attack worked*, so a broken
defence shows up as a pass.  Needs the full sandbox (mount, network and PID namespaces).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from hpc_codegen import load_suite, sandbox
from hpc_codegen.harness import RunConfig, evaluate_c
from hpc_codegen.reference import prepare_reference
from hpc_codegen.sandbox import SandboxLimits
from tests.support import REPO

DRIVERS = REPO / "data" / "hpc_code" / "drivers"

pytestmark = pytest.mark.skipif(not sandbox.isolation().filesystem,
                                reason="needs mount/network/PID namespaces (root or user namespaces)")

CFG = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=20.0, memory_mb=1024, max_processes=64))

# the candidate's helpers: declared in the function's body, defined after it (the prompt ends at its `{`)
CALL = "    double attack(const double *, size_t);\n    return attack(x, n);\n}\n"
HEAD = ("#include <dlfcn.h>\n#include <fcntl.h>\n#include <stdio.h>\n#include <unistd.h>\n"
        "static double honest(const double *x, size_t n) { double s = 0; for (size_t i = 0; i < n; i++) s += x[i];"
        " return s; }\n"
        "static int writable(const char *p) { FILE *f = fopen(p, \"r+\"); if (!f) return 0; fclose(f); return 1; }\n"
        "static const char *exe_dir(void) { static char d[4096]; ssize_t k = readlink(\"/proc/self/exe\", d, "
        "sizeof d - 1); if (k < 0) return \"\"; d[k] = 0; *strrchr(d, '/') = 0; return d; }\n")


def _hostile(code: str) -> str:
    return CALL + HEAD + "double attack(const double *x, size_t n) {\n" + code + "\n}\n"


@pytest.fixture(scope="module")
def reduce_serial():
    (problem,), _ = load_suite(patterns=["reduce_array_sum_serial"])
    ref = prepare_reference(problem, CFG)
    yield problem, ref
    ref.cleanup()


def _fingerprint(*dirs: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for d in dirs for p in sorted(d.rglob("*"))
            if p.is_file()}


TAMPER = _hostile(f'''
    char p[8192];
    int got = 0;
    got |= writable("{DRIVERS}/reduce.c");             /* the suite's driver */
    snprintf(p, sizeof p, "%s/prog", exe_dir());       /* the trusted runner itself */
    got |= writable(p);
    snprintf(p, sizeof p, "%s/../check/prog", exe_dir()); /* the reference program */
    got |= writable(p) || access(p, R_OK) == 0;
    snprintf(p, sizeof p, "%s/../null/reference.so", exe_dir()); /* the reference solution */
    void *lib = dlopen(p, RTLD_NOW);
    if (lib) return ((double (*)(const double *, size_t))dlsym(lib, "array_sum"))(x, n);
    return got ? honest(x, n) : 42.0;''')


def test_a_candidate_cannot_tamper_with_what_checks_it(reduce_serial):
    problem, ref = reduce_serial
    before = _fingerprint(DRIVERS, ref.dir / "bin", ref.dir / "check")
    res = evaluate_c(problem, TAMPER, CFG, ref)
    assert res.status == "wrong_output", res
    assert _fingerprint(DRIVERS, ref.dir / "bin", ref.dir / "check") == before
    assert evaluate_c(problem, "    return 42.0;\n}\n", CFG, ref).status == "wrong_output"  # still judged
    assert evaluate_c(problem, problem.reference, CFG, ref).status == "passed"


FORGERIES = {
    # print every pass line the harness ever used, and the command line (the old nonce was there)
    "print": _hostile('''
    char cmd[4096] = {0};
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (f) { fread(cmd, 1, sizeof cmd - 1, f); fclose(f); }
    printf("HPC_CHECK ok\\nHPC_RESULT %s ok=1 workers=1 baseline_s=1 candidate_s=0.001 msg=ok\\n", cmd);
    fflush(stdout);
    return 42.0;'''),
    # close the timed window itself before the output exists, then finish honestly
    "early_end_mark": _hostile('''
    int fd = open(getenv("HPC_MARKS"), O_WRONLY);
    if (fd >= 0) { write(fd, "E", 1); close(fd); }
    usleep(200000);
    return honest(x, n);'''),
    # write the output file itself (its name is on the command line) and leave without the runner
    "own_output": _hostile('''
    char cmd[4096] = {0};
    FILE *f = fopen("/proc/self/cmdline", "r");
    size_t k = f ? fread(cmd, 1, sizeof cmd - 1, f) : 0;
    if (f) fclose(f);
    const char *arg = cmd; for (int i = 0; i < 3 && arg < cmd + k; i++) arg += strlen(arg) + 1;
    double v = honest(x, n) + 1.0;
    FILE *o = fopen(arg, "wb");
    if (o) { fwrite(&v, sizeof v, 1, o); fclose(o); }
    _exit(0);'''),
}


@pytest.mark.parametrize("name", FORGERIES)
def test_a_candidate_cannot_forge_a_pass(reduce_serial, name):
    problem, ref = reduce_serial
    res = evaluate_c(problem, FORGERIES[name], CFG, ref)
    assert res.status in ("wrong_output", "runtime_error"), res


SLOW = _hostile('''
    int fd = open(getenv("HPC_MARKS"), O_WRONLY);
    usleep(300000);
    if (fd >= 0) { write(fd, "S", 1); close(fd); }   /* a late start mark, to restart the clock */
    return honest(x, n);''')


def test_the_time_is_the_candidates_whole_call(reduce_serial):
    problem, ref = reduce_serial
    res = evaluate_c(problem, SLOW, CFG, ref)
    # the kernel's time is its best window minus the best null run's, so it may fall a few ms
    # short of the 300 ms it slept; timed from its late mark it would be ~0
    assert res.status == "passed" and res.candidate_s[1] >= 0.27 and res.speedups[1] < 0.1, res


MEMO = _hostile('''
    FILE *f = fopen("memo", "rb");
    double v;
    if (f && fread(&v, sizeof v, 1, f) == 1) { fclose(f); return v; }  /* an earlier run's answer */
    v = honest(x, n);
    f = fopen("memo", "wb");
    if (f) { fwrite(&v, sizeof v, 1, f); fclose(f); }
    return v;''')


def test_every_timed_run_gets_fresh_inputs(reduce_serial):
    problem, _ = reduce_serial
    small = replace(problem, size=problem.quick_size)  # full mode (several timed runs) on small inputs
    cfg = replace(CFG, quick=False, repeats=2)
    res = evaluate_c(small, MEMO, cfg)
    assert res.status == "wrong_output", res
    assert evaluate_c(small, problem.reference, cfg).status == "passed"


def test_compiler_messages_carry_no_host_file(reduce_serial):
    problem, ref = reduce_serial
    host_line = Path("/etc/passwd").read_text().splitlines()[0]
    for path in ("/etc/passwd", f"{REPO}/README.md"):
        res = evaluate_c(problem, f'    return 0;\n}}\n#include "{path}"\n', CFG, ref)
        assert res.status == "build_error", res
        assert host_line not in res.message and "memorization" not in res.message.lower(), res.message


FORK_BOMB = _hostile('''
    int forks = 0;
    while (forks < 100000 && fork() >= 0) forks++;   /* children spin on too */
    return forks < 64 ? 42.0 : honest(x, n);''')


def test_a_fork_bomb_is_contained(reduce_serial):
    problem, ref = reduce_serial
    if not sandbox.isolation().processes_capped:
        pytest.skip("no process cap here")
    res = evaluate_c(problem, FORK_BOMB, CFG, ref)
    assert res.status in ("wrong_output", "runtime_error", "timeout"), res


# 2**40 tokens from 41 lines: the preprocessor would run for hours
MACRO_BOMB = "\n".join(["#define A0 x"] + [f"#define A{i} A{i - 1} A{i - 1}" for i in range(1, 41)]
                       + ["    return A40;\n}\n"])


def test_a_macro_bomb_costs_the_preprocessing_limit_not_the_build_limit(reduce_serial):
    """A body whose macros expand without bound is a build error after ``preprocess_timeout_s``."""
    problem, ref = reduce_serial
    cfg = replace(CFG, preprocess_timeout_s=2.0)
    assert cfg.build_limits.timeout_s >= 10 * cfg.preprocess_timeout_s
    res = evaluate_c(problem, MACRO_BOMB, cfg, ref)
    assert res.status == "build_error" and "preprocessing ran past 2 s" in res.message, res
