#define _GNU_SOURCE
#include "CPeers.h"
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct files_job {
    const char *const *paths;
    size_t count;
    atomic_size_t next;
    atomic_llong bytes;
    atomic_ullong sum;
};

static void *files_worker(void *raw) {
    struct files_job *job = raw;
    size_t capacity = 1 << 20;
    unsigned char *buffer = malloc(capacity);
    long long bytes = 0;
    unsigned long long sum = 0;
    for (;;) {
        size_t index = atomic_fetch_add(&job->next, 1);
        if (index >= job->count) break;
        int fd = open(job->paths[index], O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat info;
        if (fstat(fd, &info) != 0) { close(fd); continue; }
        size_t want = (size_t)info.st_size;
        if (want > capacity) { free(buffer); capacity = want; buffer = malloc(capacity); }
        size_t got = 0;
        ssize_t n;
        while (got < want && (n = read(fd, buffer + got, want - got)) > 0) got += (size_t)n;
        close(fd);
        bytes += (long long)got;
        if (got) sum += buffer[0] + buffer[got - 1] + got;
    }
    atomic_fetch_add(&job->bytes, bytes);
    atomic_fetch_add(&job->sum, sum);
    free(buffer);
    return NULL;
}

int64_t peer_read_files(const char *const *paths, size_t count, int threads, uint64_t *checksum) {
    struct files_job job = { paths, count, 0, 0, 0 };
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_t handles[64];
    for (int k = 0; k < threads; k++) pthread_create(&handles[k], NULL, files_worker, &job);
    for (int k = 0; k < threads; k++) pthread_join(handles[k], NULL);
    *checksum = atomic_load(&job.sum);
    return atomic_load(&job.bytes);
}

struct random_job { int fd; int64_t blocks; long count; unsigned seed; uint64_t sum; };

static void *random_worker(void *raw) {
    struct random_job *job = raw;
    unsigned char buffer[4096];
    for (long i = 0; i < job->count; i++) {
        int64_t block = (int64_t)(rand_r(&job->seed) % job->blocks);
        if (pread(job->fd, buffer, sizeof buffer, block * 4096) > 0) job->sum += buffer[7];
    }
    return NULL;
}

uint64_t peer_random_reads(int fd, int64_t size, long count, int threads, unsigned seed) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_t handles[64];
    struct random_job jobs[64];
    for (int k = 0; k < threads; k++) {
        jobs[k] = (struct random_job){ fd, size / 4096, count / threads, seed + (unsigned)k, 0 };
        pthread_create(&handles[k], NULL, random_worker, &jobs[k]);
    }
    uint64_t sum = 0;
    for (int k = 0; k < threads; k++) { pthread_join(handles[k], NULL); sum += jobs[k].sum; }
    return sum;
}
