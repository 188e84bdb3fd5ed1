/* state_check.bpf.c has no types of its own: this header exists for the Makefile's %.bpf.o rule. */
#ifndef PATHPROF_STATE_CHECK_H
#define PATHPROF_STATE_CHECK_H
#endif
