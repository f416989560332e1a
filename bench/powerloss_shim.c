/* What a power cut leaves of the archive's files, for bench/crash_kills.py (docs/reliability.md).
 *
 * Preloaded into the process that writes the archive (LD_PRELOAD), it wraps fsync and fdatasync:
 * after the real call returns, the file's bytes are what the disk is promised to hold, and a copy
 * of them is written to $POWERLOSS_DIR/<file name> (through a temporary name and a rename, so a
 * kill at any instant leaves a whole copy). A power cut at any instant leaves, for each file, its
 * bytes at its last sync: the pessimistic reading of POSIX, where nothing written since is kept.
 * Files never synced are absent. Only files inside $POWERLOSS_WATCH are copied.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void keep_synced_copy(int fd) {
    const char *watch = getenv("POWERLOSS_WATCH"), *out = getenv("POWERLOSS_DIR");
    char link[64], path[PATH_MAX], target[PATH_MAX], partial[PATH_MAX + 16];
    struct stat st;
    if (!watch || !out || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return;
    path[n] = '\0';
    if (strncmp(path, watch, strlen(watch)) != 0) return;
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    snprintf(target, sizeof target, "%s/%s", out, name);
    snprintf(partial, sizeof partial, "%s.partial", target);
    int copy = open(partial, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (copy < 0) return;
    char buffer[1 << 16];
    off_t at = 0;
    ssize_t got;
    while ((got = pread(fd, buffer, sizeof buffer, at)) > 0) {
        if (write(copy, buffer, (size_t)got) != got) break;
        at += got;
    }
    close(copy);
    rename(partial, target);
}

int fsync(int fd) {
    static int (*real)(int) = NULL;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    int rc = real(fd);
    if (rc == 0) keep_synced_copy(fd);
    return rc;
}

int fdatasync(int fd) {
    static int (*real)(int) = NULL;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    int rc = real(fd);
    if (rc == 0) keep_synced_copy(fd);
    return rc;
}
