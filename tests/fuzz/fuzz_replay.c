/*
 * fuzz_replay.c - runs fuzz_gguf.c's LLVMFuzzerTestOneInput over files and folders given on
 * the command line (the seed corpus), for builds without clang/libFuzzer. Exit 0 when every
 * input was processed without crashing.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    size_t got = fread(buf, 1, (size_t)(n > 0 ? n : 0), f);
    fclose(f);
    /* Also every prefix of small files: the cheap, deterministic part of fuzzing. */
    LLVMFuzzerTestOneInput(buf, got);
    if (got <= 4096)
        for (size_t k = 0; k < got; k++) LLVMFuzzerTestOneInput(buf, k);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    int rc = 0, n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "fuzz_replay: no such file or folder: %s\n", argv[i]);
            rc = 1;
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            rc |= run_file(argv[i]);
            n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            rc |= run_file(path);
            n++;
        }
        if (d) closedir(d);
    }
    printf("fuzz_replay: %d inputs replayed\n", n);
    return rc;
}
