/* Directory helpers of the disk-tier tests (test_kv_disk, test_kv_disk_load). */
#ifndef KVLLM_TEST_DIR_H
#define KVLLM_TEST_DIR_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Deletes every file in dir but the dot entries (the tests' directories hold no folders). */
static inline void clear_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    char path[4096];
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        unlink(path);
    }
    if (d) closedir(d);
}

/* How many names in dir end in suffix (and are longer than it). */
static inline int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t l = strlen(de->d_name), s = strlen(suffix);
        n += l > s && strcmp(de->d_name + l - s, suffix) == 0;
    }
    if (d) closedir(d);
    return n;
}

#endif
