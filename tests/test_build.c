/* test_build.c - the Makefile rebuilds what a change of optional libraries
 * makes stale.
 *
 * `make run` installs the libraries the command needs and `make test` the
 * rest, so a tree is often built before a library it can use is installed.
 * Every object depends on $(BUILD)/features, the probes' findings; this
 * builds one object into a scratch BUILD, checks a second make leaves it
 * alone, then plants a stale finding (as a build made before Faiss and
 * libmicrohttpd were installed would have left) and checks the next make
 * compiles the object again and settles. Run from the repository root. */
#include "test.h"
#include "test_proc.h"

#define OUT_MAX (1 << 16)

/* make OBJ in BUILD=dir; returns whether it compiled the source (-1 if make failed).
 * MAKEFLAGS is dropped so the sub-make does not join make test's jobserver. */
static int make_compiles(const char *dir, const char *obj, const char *src, char *out)
{
    int rc = proc_sh(out, OUT_MAX,
                     "env -u MAKEFLAGS -u MAKELEVEL make --no-print-directory -j1 BUILD='%s' '%s/%s' 2>&1", dir,
                     dir, obj);
    if (rc != 0) {
        fprintf(stderr, "make %s/%s failed (%d):\n%s\n", dir, obj, rc, out);
        return -1;
    }
    return strstr(out, src) != NULL;
}

int main(void)
{
    char *out = malloc(OUT_MAX);
    CHECK(out != NULL, "out of memory");
    if (!out) return test_summary("test_build");
    char dir[] = "/tmp/sparq_build_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp failed");

    const char *obj = "obj/util/cpu.o", *src = "-c src/util/cpu.c";
    CHECK(make_compiles(dir, obj, src, out) == 1, "the first make did not compile %s", src);
    CHECK(make_compiles(dir, obj, src, out) == 0, "a second make compiled %s again:\n%s", src, out);

    char path[512], real[256] = "";
    snprintf(path, sizeof path, "%s/features", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "make wrote no %s", path);
    if (f) {
        CHECK(fgets(real, sizeof real, f) && strstr(real, "server=") && strstr(real, "faiss="),
              "%s does not name the probes' findings: %s", path, real);
        fclose(f);
    }
    /* The findings of a tree built before any optional library was installed. */
    f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs("zlib= server= faiss=\n", f);
        fclose(f);
    }
    if (strcmp(real, "zlib= server= faiss=\n") == 0) {
        test_skip("no optional library is installed here: the planted findings are the real ones");
    } else {
        CHECK(make_compiles(dir, obj, src, out) == 1, "changed findings did not recompile %s", src);
        CHECK(make_compiles(dir, obj, src, out) == 0, "make compiled %s again with unchanged findings:\n%s",
              src, out);
        f = fopen(path, "r");
        char now[256] = "";
        CHECK(f && fgets(now, sizeof now, f) && strcmp(now, real) == 0,
              "%s holds '%s', not the probes' '%s'", path, now, real);
        if (f) fclose(f);
    }
    proc_sh(NULL, 0, "rm -rf '%s'", dir);
    free(out);
    return test_summary("test_build");
}
