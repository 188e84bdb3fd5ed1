/* microbench.bpf.c: the variants bench/bpf_helpers attaches one at a time (program names mb_<variant>). Shared
 * with nothing else: the bench reads only the kernel's per-program statistics. */
#ifndef PATHPROF_MICROBENCH_H
#define PATHPROF_MICROBENCH_H
#define MB_VARIANTS "empty pid_filter clock task_storage percpu_add hash_lookup field_read"
#endif
