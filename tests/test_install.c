/* test_install.c - the installed library as a user meets it.
 *
 * Checks build/libsparq.so exports exactly the SPARQ_API functions of
 * the public headers (a declaration without SPARQ_API links statically but is
 * missing from the .so) under the soname libsparq.so.0; then runs
 * `make install DESTDIR=TMP`, builds examples/simple.c with
 * `pkg-config --cflags --libs sparq` against that tree, runs it, compares
 * its output with `sparq run`'s, and checks `make uninstall` removes every
 * installed file. Run from the repository root with $SPARQ_BUILD set. */
#include "test.h"
#include "test_proc.h"
#include "util/paths.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUT_MAX (1 << 20)

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Every `SPARQ_API ... sparq_NAME(` in include/ must be a dynamic symbol
 * of lib; every dynamic symbol lib defines must start with sparq_. */
static void check_exports(const char *lib, char *buf)
{
    int rc = proc_sh(buf, OUT_MAX, "nm -D --defined-only '%s' | awk '{print $3}'", lib);
    CHECK(rc == 0, "nm -D %s failed (%d)", lib, rc);
    if (rc) return;
    int n_syms = 0, foreign = 0;
    for (char *line = buf; *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (*line) {
            n_syms++;
            if (strncmp(line, "sparq_", 6) != 0) {
                if (foreign++ < 5) fprintf(stderr, "exported but not sparq_*: %s\n", line);
            }
        }
        if (!nl) break;
        *nl = '\n';
        line = nl + 1;
    }
    CHECK(foreign == 0, "%s exports %d symbols that are not sparq_*", lib, foreign);
    CHECK(n_syms > 20, "%s exports only %d symbols", lib, n_syms);

    DIR *d = opendir("include");
    CHECK(d != NULL, "cannot open include/ (run from the repository root)");
    if (!d) return;
    int declared = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
        char path[512];
        snprintf(path, sizeof path, "include/%s", e->d_name);
        size_t n;
        char *text = test_read_file(path, &n);
        CHECK(text != NULL, "cannot read %s", path);
        if (!text) continue;
        for (char *line = text; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = 0;
            /* A declaration starts at column 0 and calls a sparq_ function. */
            char *paren = strchr(line, '(');
            char *name = strstr(line, "sparq_");
            if (strncmp(line, "SPARQ_API ", 10) == 0 && paren && name && name < paren) {
                char *last = NULL;
                for (char *q = name; q && q < paren; q = strstr(q + 1, "sparq_"))
                    if (q < paren) last = q;
                char fn[128];
                int k = 0;
                while (last[k] && (last[k] == '_' || (last[k] >= 'a' && last[k] <= 'z') ||
                                   (last[k] >= '0' && last[k] <= '9')) && k < 127) {
                    fn[k] = last[k];
                    k++;
                }
                fn[k] = 0;
                char pat[160];
                snprintf(pat, sizeof pat, "\n%s\n", fn);
                char *hay = malloc(strlen(buf) + 3);
                if (hay) {
                    sprintf(hay, "\n%s\n", buf);
                    CHECK(strstr(hay, pat) != NULL, "%s declares %s but %s does not export it", path, fn,
                          lib);
                    free(hay);
                }
                declared++;
            } else if (line[0] && line[0] != ' ' && line[0] != '#' && line[0] != '/' && line[0] != '*' &&
                       paren && name && name < paren && strncmp(line, "typedef", 7) &&
                       strncmp(line, "enum", 4) && strncmp(line, "static", 6)) {
                /* A declaration without the macro: hidden in the .so. */
                CHECK(0, "%s: declaration without SPARQ_API: %s", path, line);
            }
            line = nl ? nl + 1 : NULL;
        }
        free(text);
    }
    closedir(d);
    CHECK(declared >= 30, "found only %d SPARQ_API declarations in include/", declared);
}

int main(void)
{
    const char *build = getenv("SPARQ_BUILD");
    if (!build || !*build) build = "build";
    char *buf = malloc(OUT_MAX), *want = malloc(OUT_MAX);
    CHECK(buf && want, "out of memory");
    if (!buf || !want) return test_summary("test_install");

    char so[512];
    snprintf(so, sizeof so, "%s/libsparq.so", build);
    CHECK(exists(so), "%s was not built", so);
    check_exports(so, buf);
    int rc = proc_sh(buf, OUT_MAX, "readelf -d '%s' | grep SONAME", so);
    CHECK(rc == 0 && strstr(buf, "[libsparq.so.0]"), "soname of %s: %s", so, buf);
    /* A sanitizer build's library needs the example built the same way. */
    const int asan = proc_sh(NULL, 0, "readelf -d '%s' | grep -q libasan", so) == 0;

    char tmp[] = "/tmp/sparq_install_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp failed");
    /* MAKEFLAGS is dropped so the sub-make does not join make test's jobserver. */
    rc = proc_sh(buf, OUT_MAX, "env -u MAKEFLAGS -u MAKELEVEL make -s --no-print-directory install BUILD='%s' "
                 "PREFIX=/usr/local DESTDIR='%s' 2>&1",
                 build, tmp);
    CHECK(rc == 0, "make install DESTDIR=%s failed (%d): %s", tmp, rc, buf);

    static const char *const files[] = {
        "bin/sparq", "lib/libsparq.a", "lib/libsparq.so", "lib/libsparq.so.0", "include/sparq.h",
        "include/sparq_attn.h", "lib/pkgconfig/sparq.pc", "share/sparq/models/stories260K.gguf",
        "share/sparq/models/LICENSE.llama2.c.MIT.txt",
    };
    char path[1024];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/usr/local/%s", tmp, files[i]);
        CHECK(exists(path), "make install did not install %s", path);
    }
    snprintf(path, sizeof path, "%s/usr/local/lib/libsparq.so", tmp);
    char target[256] = "";
    ssize_t tl = readlink(path, target, sizeof target - 1);
    if (tl > 0) target[tl] = 0;
    CHECK(strcmp(target, "libsparq.so.0") == 0, "libsparq.so -> '%s', want libsparq.so.0", target);

    /* The example, built the way the README says, against the staged tree. */
    char env[2048];
    snprintf(env, sizeof env,
             "PKG_CONFIG_PATH='%s/usr/local/lib/pkgconfig' PKG_CONFIG_SYSROOT_DIR='%s'", tmp, tmp);
    rc = proc_sh(buf, OUT_MAX, "%s pkg-config --cflags --libs sparq", env);
    CHECK(rc == 0 && strstr(buf, "-lsparq") && strstr(buf, tmp), "pkg-config --cflags --libs sparq: %s",
          buf);
    rc = proc_sh(buf, OUT_MAX, "%s cc -std=c11 -Wall -Wextra -Werror %s examples/simple.c "
                 "$(%s pkg-config --cflags --libs sparq) -o '%s/simple' 2>&1",
                 env, asan ? "-fsanitize=address,undefined" : "", env, tmp);
    CHECK(rc == 0, "building examples/simple.c with pkg-config failed: %s", buf);
    /* It must have linked the shared library, not the static one. */
    rc = proc_sh(buf, OUT_MAX, "readelf -d '%s/simple' | grep NEEDED", tmp);
    CHECK(rc == 0 && strstr(buf, "libsparq.so.0"), "simple does not need libsparq.so.0: %s", buf);

    char model[4096];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found: the example was built but not run");
    } else {
        const char *prompt = "Once upon a time";
        rc = proc_sh(buf, OUT_MAX, "LD_LIBRARY_PATH='%s/usr/local/lib' '%s/simple' '%s' '%s' 40", tmp, tmp, model,
                     prompt);
        CHECK(rc == 0, "examples/simple failed (%d)", rc);
        int rc2 = proc_sh(want, OUT_MAX, "'%s/sparq' run -m '%s' -p '%s' -n 40 --temp 0 -c 512 2>/dev/null",
                          build, model, prompt);
        CHECK(rc2 == 0, "sparq run failed (%d)", rc2);
        CHECK(rc == 0 && rc2 == 0 && strlen(want) > 20 && strcmp(buf, want) == 0,
              "examples/simple printed '%s', sparq run '%s'", buf, want);
        /* As the README writes it: a bare model name, which the installed
         * library finds in its share/sparq/models (from /, no search path) */
        rc = proc_sh(buf, OUT_MAX, "cd / && env -u SPARQ_MODEL_PATH LD_LIBRARY_PATH='%s/usr/local/lib' "
                     "'%s/simple' stories260K.gguf '%s' 40", tmp, tmp, prompt);
        CHECK(rc == 0 && strcmp(buf, want) == 0, "simple with the bare name printed '%s' (%d)", buf, rc);
        /* The installed command runs too. */
        rc = proc_sh(buf, OUT_MAX, "'%s/usr/local/bin/sparq' run -m '%s' -p '%s' -n 40 --temp 0 -c 512 2>/dev/null",
                     tmp, model, prompt);
        CHECK(rc == 0 && strcmp(buf, want) == 0, "installed sparq printed '%s'", buf);
        /* and finds its default model in PREFIX/share/sparq/models: no -m,
         * no SPARQ_MODEL_PATH, a cwd with no ../shared */
        rc = proc_sh(buf, OUT_MAX, "mkdir -p '%s/cwd' && cd '%s/cwd' && test ! -e ../shared && "
                     "env -u SPARQ_MODEL_PATH '%s/usr/local/bin/sparq' run -p '%s' -n 40 --temp 0 -c 512 2>/dev/null",
                     tmp, tmp, tmp, prompt);
        CHECK(rc == 0 && strcmp(buf, want) == 0, "installed sparq without -m printed '%s'", buf);
    }

    rc = proc_sh(buf, OUT_MAX, "env -u MAKEFLAGS -u MAKELEVEL make -s --no-print-directory uninstall BUILD='%s' "
                 "PREFIX=/usr/local DESTDIR='%s' 2>&1",
                 build, tmp);
    CHECK(rc == 0, "make uninstall failed (%d): %s", rc, buf);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/usr/local/%s", tmp, files[i]);
        CHECK(!exists(path), "make uninstall left %s", path);
    }
    rc = proc_sh(buf, OUT_MAX, "find '%s/usr/local' -type f -o -type l | grep -v '^%s/simple$'", tmp, tmp);
    CHECK(buf[0] == 0, "make uninstall left files: %s", buf);
    proc_sh(NULL, 0, "rm -rf '%s'", tmp);
    free(buf);
    free(want);
    return test_summary("test_install");
}
