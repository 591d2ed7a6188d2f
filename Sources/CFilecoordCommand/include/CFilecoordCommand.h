#ifndef CFILECOORD_COMMAND_H
#define CFILECOORD_COMMAND_H

#include <sys/types.h>

// The filecoord tool's own C code: how `exec` starts its command and passes signals on
// to it, and signals caught into a pipe. Apart from the library's shims: no library
// module runs a command or handles a signal.

/// Notes what a command run by `filecoord exec` must inherit from this process's own
/// start: the signals ignored then (`nohup`, a shell's background job) and the
/// descriptors open then (3 and up, with their files' identities). Also unblocks SIGINT,
/// SIGTERM, SIGHUP and SIGQUIT in the calling thread, and so in every thread it starts
/// after: a process started from a thread that blocks them (any libdispatch worker, so
/// any Swift task that runs `Process`) inherits the mask. SIGQUIT, unless ignored, gets its
/// default action back from the Swift runtime's backtracer. Call first in main.
void fc_note_startup(void);
/// Caps glibc's malloc at one arena a core (its default: eight a core). Each arena
/// reserves 64 MiB of address space, and a thread that allocates while the others hold
/// theirs gets a new one: under `ulimit -v`, with the I/O pool grown on a loaded
/// machine, the arenas took the address space and a streamed chunk's allocation failed
/// (docs/reliability.md, Results). Call first in main, before any thread starts.
void fc_limit_malloc_arenas(void);
/// Whether standard descriptor `fd` (0, 1 or 2) was closed when this process started;
/// `fc_note_startup` put /dev/null in its place, so that no file of the command's takes it.
int fc_standard_descriptor_was_closed(int fd);
/// Whether signal `number` was ignored when this process started (per `fc_note_startup`).
int fc_ignored_at_start(int number);
/// posix_spawnp for `exec`: no signal blocked; the signals this process ignores that were
/// not ignored at its start reset to default; the descriptors noted at start passed on
/// (when still the same files), and the `kept_count` descriptors of `kept` (this
/// process's own, passed on on purpose), every other one closed; `stdin_fd`, unless -1,
/// as its standard input. Returns 0 or an errno value.
int fc_spawn_command(pid_t *pid, const char *file, char *const argv[], char *const envp[], const int *kept, int kept_count,
                     int stdin_fd);
/// From now until `fc_wait_command` returns (or `fc_forward_signals_end`), SIGINT,
/// SIGTERM, SIGHUP and SIGQUIT (those not ignored) sent by another process are passed on
/// to the command; those a terminal sent (to the whole process group, the command
/// included) are dropped. Either way this process does not die of them meanwhile. One
/// that comes before the command's pid is known is passed on once it is.
void fc_forward_signals_begin(void);
/// The command's pid, once started.
void fc_forward_signals_to(pid_t pid);
/// Puts the previous handlers back; a signal that came while the command could not be
/// started is raised in this process.
void fc_forward_signals_end(void);
/// Waits for the command, stops forwarding before reaping it, and returns its exit
/// status (128+N for signal N), or -errno.
int fc_wait_command(pid_t pid);
/// The signal that ended the command `fc_wait_command` last reaped, or 0 when it exited.
int fc_last_command_signal(void);

/// Ends the process by signal `number`, as if it had not been caught: the default action
/// put back, the signal unblocked in the calling thread and raised there (no core dump for
/// SIGQUIT: the process has cleaned up). The shell then sees 128 + `number`. Does not return.
void fc_die_by_signal(int number) __attribute__((noreturn));

/// Catches the `count` signals in `numbers` with a handler that writes each one's number
/// (one byte) into a pipe, and returns the pipe's read end (-1 with errno set on
/// failure). Whichever thread the kernel picks runs the handler, so none is lost; the
/// reader learns of it by reading the pipe. Every call returns the same pipe.
int fc_catch_signals(const int *numbers, int count);
/// Puts the default action back for the `count` signals in `numbers`.
void fc_uncatch_signals(const int *numbers, int count);

/// pipe2(2) with O_CLOEXEC (glibc's declaration needs _GNU_SOURCE, which Swift's Glibc lacks).
int fc_pipe_cloexec(int fds[2]);
#endif
