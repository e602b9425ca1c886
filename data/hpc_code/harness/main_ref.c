/* The trusted reference program of a problem: driver + this main, built and run where no
 * candidate can reach it (the candidate's function is never called, nor linked).
 *
 * usage: ref baseline N SEED OUT      serial baseline (hpc_baseline) on the inputs of size N
 *                                     from SEED; writes its output's bytes to OUT
 *                                     (marking the window around the kernel: S ... E)
 *        ref check N SEED WANT GOT    compares a candidate's output file GOT with the
 *                                     baseline's WANT (the driver's hpc_check, tolerances
 *                                     included) and prints
 *                                       HPC_CHECK ok
 *                                       HPC_CHECK wrong <what differs>
 * Exit status 0 with a verdict, 2 on bad usage or an unreadable WANT.  It needs no MPI
 * start-up, even for MPI problems.
 */
#include "hpc_harness.h"

HPC_OUTPUT_STATE

int main(int argc, char **argv) {
    int baseline = argc == 5 && strcmp(argv[1], "baseline") == 0;
    int check = argc == 6 && strcmp(argv[1], "check") == 0;
    if (!baseline && !check) {
        fprintf(stderr, "usage: %s baseline N SEED OUT | check N SEED WANT GOT\n", argv[0]);
        return 2;
    }
    void *ctx = hpc_setup(atol(argv[2]), strtoull(argv[3], NULL, 10));
    void *got, *want;
    size_t bytes = hpc_result(ctx, &got, &want);
    if (baseline) {
        memset(want, 0, bytes); /* first touch, as hpc_reset does for the candidate's buffer */
        hpc_mark('S');
        hpc_baseline(ctx);
        hpc_mark('E');
        if (hpc_write_file(argv[4], want, bytes) != 0) {
            fprintf(stderr, "ref: cannot write %s\n", argv[4]);
            return 2;
        }
        hpc_free(ctx);
        return 0;
    }
    if (hpc_read_file(argv[4], want, bytes) != 0) {
        fprintf(stderr, "ref: cannot read the baseline's output %s\n", argv[4]);
        return 2;
    }
    long got_size = hpc_read_file(argv[5], got, bytes);
    char msg[256] = "";
    int ok = 0;
    if (got_size == -1)
        snprintf(msg, sizeof msg, "no output file");
    else if (got_size == -2)
        snprintf(msg, sizeof msg, "empty output file (expected %zu bytes)", bytes);
    else if (got_size != 0)
        snprintf(msg, sizeof msg, "output has %ld bytes, expected %zu", got_size, bytes);
    else
        ok = hpc_check(ctx, msg, sizeof msg);
    printf(ok ? "HPC_CHECK ok\n" : "HPC_CHECK wrong %s\n", msg);
    hpc_free(ctx);
    return 0;
}
