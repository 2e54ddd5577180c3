/* test_layers.c - the source tree keeps its layering (src/README.md).
 *
 * Reads every file under src/LAYER/ and checks each include directive
 * (`#include "..."`, `# include "..."`, and `<...>` naming a project folder):
 *   - a project header is included with quotes, never <...>;
 *   - it names a header with its folder ("attn/attn.h"), or the public
 *     "sparq.h"/"sparq_attn.h", or a file of the same folder;
 *   - the named header exists;
 *   - its layer is one the including file's layer may include (the table of
 *     src/README.md: eval and bench share an order but neither includes the
 *     other; cli includes everything; server what is below eval, never
 *     cli, the command it is a sibling of);
 *   - the project headers' include graph has no cycle.
 * The layer order is written here a second time, on purpose: a change to it
 * must be made in src/README.md and here, not slip in with an include.
 * A planted tree of violations (one per rule) must make every rule fire.
 */
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>

/* may: bit i set = may include layers[i] */
#define BELOW(n) ((1u << (n)) - 1u)
static const struct { const char *dir; unsigned may; } layers[] = {
    { "util", BELOW(1) },     { "tensor", BELOW(2) }, { "index", BELOW(3) },
    { "attn", BELOW(4) },     { "io", BELOW(5) },     { "core", BELOW(6) },
    { "eval", BELOW(6) | 1u << 6 },                             /* 0-5 and itself */
    { "bench", BELOW(6) | 1u << 7 },                            /* 0-5 and itself */
    { "cli", BELOW(10) },                                       /* everything */
    { "server", BELOW(6) | 1u << 9 },                           /* 0-5 and itself */
};
enum { N_LAYERS = sizeof layers / sizeof layers[0] };

/* violations found by the current scan (the main tree's are CHECK failures,
   the planted tree's are counted and printed only when missing) */
static int n_violations, quiet;
#define VIOLATION(...)                                                       \
    do {                                                                     \
        n_violations++;                                                      \
        if (!quiet) CHECK(0, __VA_ARGS__);                                   \
    } while (0)

static int layer_index(const char *dir)
{
    for (int i = 0; i < N_LAYERS; i++)
        if (!strcmp(layers[i].dir, dir)) return i;
    return -1;
}

/* headers seen, for the cycle check: name "dir/file.h" and its includes */
enum { MAX_HDR = 256, MAX_INC = 32 };
typedef struct { char name[128]; char inc[MAX_INC][128]; int n_inc; int mark; } header;
static header hdrs[MAX_HDR];
static int n_hdrs;

static header *header_get(const char *name)
{
    for (int i = 0; i < n_hdrs; i++)
        if (!strcmp(hdrs[i].name, name)) return &hdrs[i];
    if (n_hdrs == MAX_HDR) return NULL;
    header *h = &hdrs[n_hdrs++];
    snprintf(h->name, sizeof h->name, "%s", name);
    return h;
}

/* An include directive: optional blanks, '#', optional blanks, "include",
   blanks, then "name" or <name>. Returns 0 with the name, -1 for any other
   line. */
static int parse_include(const char *line, char *name, size_t size, int *angle)
{
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p++ != '#') return -1;
    while (*p == ' ' || *p == '\t') p++;
    if (strncmp(p, "include", 7)) return -1;
    p += 7;
    while (*p == ' ' || *p == '\t') p++;
    const char close = *p == '"' ? '"' : *p == '<' ? '>' : 0;
    if (!close) return -1;
    *angle = close == '>';
    const char *end = strchr(++p, close);
    if (!end || (size_t)(end - p) >= size) return -1;
    memcpy(name, p, (size_t)(end - p));
    name[end - p] = 0;
    return 0;
}

static void check_file(const char *src, const char *dir, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%.200s/%.60s/%.200s", src, dir, file);
    size_t n;
    char *text = test_read_file(path, &n);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text) return;
    const int self_layer = layer_index(dir);
    const size_t len = strlen(file);
    header *self = NULL;
    if (len > 2 && !strcmp(file + len - 2, ".h")) {
        char name[128];
        snprintf(name, sizeof name, "%.60s/%.60s", dir, file);
        self = header_get(name);
    }
    for (char *line = text; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = 0;
        char inc[128];
        int angle = 0;
        if (parse_include(line, inc, sizeof inc, &angle)) {
            line = next;
            continue;
        }
        if (!strcmp(inc, "sparq.h") || !strcmp(inc, "sparq_attn.h")) {
            line = next;
            continue;
        }
        char idir[64] = "", ifile[128] = "";
        const char *slash = strchr(inc, '/');
        if (slash) {
            snprintf(idir, sizeof idir, "%.*s", (int)(slash - inc < 63 ? slash - inc : 63), inc);
            snprintf(ifile, sizeof ifile, "%s", slash + 1);
        } else if (!angle) {
            snprintf(idir, sizeof idir, "%.60s", dir);
            snprintf(ifile, sizeof ifile, "%s", inc);
        }
        const int ilayer = idir[0] ? layer_index(idir) : -1;
        if (angle) { /* a system header, unless it names a project folder */
            if (ilayer < 0) {
                line = next;
                continue;
            }
            VIOLATION("%s/%s includes <%s>: a project header is included with quotes", dir, file,
                      inc);
        }
        char ipath[512];
        struct stat st;
        snprintf(ipath, sizeof ipath, "%s/%s/%s", src, idir, ifile);
        if (stat(ipath, &st) != 0)
            VIOLATION("%s/%s includes \"%s\", which is not %s", dir, file, inc, ipath);
        if (ilayer < 0)
            VIOLATION("%s/%s includes \"%s\" from an unknown layer", dir, file, inc);
        else if (self_layer >= 0 && !(layers[self_layer].may & 1u << ilayer))
            VIOLATION("%s/%s (layer %s) includes \"%s\" from %s, which %s may not include "
                      "(src/README.md)", dir, file, dir, inc, idir, dir);
        if (self && self->n_inc < MAX_INC)
            snprintf(self->inc[self->n_inc++], sizeof self->inc[0], "%.60s/%.60s", idir, ifile);
        line = next;
    }
    free(text);
}

/* depth-first search; mark 1 = on the current path, 2 = done */
static int has_cycle(header *h, char *path, size_t size)
{
    if (h->mark == 1) {
        snprintf(path, size, "%s", h->name);
        return 1;
    }
    if (h->mark == 2) return 0;
    h->mark = 1;
    for (int i = 0; i < h->n_inc; i++) {
        header *t = header_get(h->inc[i]);
        if (t && has_cycle(t, path, size)) {
            size_t l = strlen(path);
            snprintf(path + l, size - l, " <- %s", h->name);
            return 1;
        }
    }
    h->mark = 2;
    return 0;
}

/* Checks every file of the tree at src; returns 0, or -1 if it cannot be read.
   Violations (and include cycles) are counted in n_violations. */
static int scan_tree(const char *src, int *n_files, int *n_dirs)
{
    n_hdrs = 0;
    memset(hdrs, 0, sizeof hdrs);
    *n_files = *n_dirs = 0;
    DIR *top = opendir(src);
    if (!top) return -1;
    struct dirent *de;
    while ((de = readdir(top))) {
        if (de->d_name[0] == '.') continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s", src, de->d_name);
        struct stat st;
        if (stat(sub, &st) || !S_ISDIR(st.st_mode)) {
            const size_t l = strlen(de->d_name);
            if (!(l > 3 && !strcmp(de->d_name + l - 3, ".md")))
                VIOLATION("%s is a source file outside a layer folder", sub);
            continue;
        }
        if (layer_index(de->d_name) < 0)
            VIOLATION("src/%s is not a layer named in src/README.md", de->d_name);
        (*n_dirs)++;
        DIR *d = opendir(sub);
        if (!d) continue;
        struct dirent *fe;
        while ((fe = readdir(d))) {
            const size_t l = strlen(fe->d_name);
            const int code = (l > 2 && (!strcmp(fe->d_name + l - 2, ".c") ||
                                        !strcmp(fe->d_name + l - 2, ".h"))) ||
                             (l > 3 && !strcmp(fe->d_name + l - 3, ".cc"));
            if (!code) continue;
            check_file(src, de->d_name, fe->d_name);
            (*n_files)++;
        }
        closedir(d);
    }
    closedir(top);
    char path[2048] = "";
    for (int i = 0; i < n_hdrs; i++)
        if (hdrs[i].mark == 0 && has_cycle(&hdrs[i], path, sizeof path)) {
            VIOLATION("include cycle: %s (headers include each other in a circle)", path);
            break;
        }
    return 0;
}

static void plant(const char *root, const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char *slash = strrchr(path, '/');
    *slash = 0;
    mkdir(path, 0700);
    *slash = '/';
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* A tree with one violation of each rule (and allowed includes that must not
   count): the scan must find exactly those. */
static void negative_control(void)
{
    char root[] = "/tmp/sparq_test_layers_XXXXXX";
    if (!mkdtemp(root)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    static const struct { const char *rel, *text; } files[] = {
        /* allowed: system headers, own layer, below, cli -> server */
        { "util/ok.c", "#include <stdio.h>\n#include <sys/stat.h>\n#include \"util/u.h\"\n" },
        { "core/c.h", "#include \"util/u.h\"\n#include \"sparq.h\"\n" },
        { "cli/cli.h", "" },
        { "cli/c.c", "#include \"server/s.h\"\n#include \"eval/e.h\"\n#include \"bench/b.h\"\n" },
        { "server/s.h", "" },
        { "eval/e.h", "" },
        { "bench/b.h", "" },
        { "tensor/t.c", "/* #include \"core/c.h\" in a comment is not a directive */\n" },
        /* 1: upward, written "# include" with blanks */
        { "util/u.h", "  #  include   \"core/c.h\"\n" },
        /* 2: a project header with <> (and upward) */
        { "attn/a.c", "#include <core/c.h>\n" },
        /* 1 each: eval -> bench, bench -> eval, server -> cli (even cli.h) */
        { "eval/e.c", "#include \"bench/b.h\"\n" },
        { "bench/b.c", "#\tinclude \"eval/e.h\"\n" },
        { "server/s.c", "#include \"cli/cli.h\"\n" },
        /* 1: a header that does not exist */
        { "io/x.c", "#include \"io/missing.h\"\n" },
        /* 1: a cycle */
        { "index/p.h", "#include \"index/q.h\"\n" },
        { "index/q.h", "#include \"p.h\"\n" },
    };
    enum { EXPECTED = 8 };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) plant(root, files[i].rel, files[i].text);
    int nf, nd;
    n_violations = 0;
    quiet = 1;
    const int rc = scan_tree(root, &nf, &nd);
    quiet = 0;
    CHECK(rc == 0 && n_violations == EXPECTED,
          "negative control: the planted tree has %d violations, the scan found %d", EXPECTED,
          n_violations);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "cannot remove %s", root);
}

int main(void)
{
    const char *src = getenv("SPARQ_SRC") ? getenv("SPARQ_SRC") : "src";
    int n_files = 0, n_dirs = 0;
    n_violations = 0;
    const int rc = scan_tree(src, &n_files, &n_dirs);
    CHECK(rc == 0, "cannot open %s (run from the repository root)", src);
    if (rc) return test_summary("test_layers");
    CHECK(n_violations == 0, "%d layering violations in %s", n_violations, src);
    CHECK(n_dirs >= 8 && n_files >= 50, "only %d layer folders and %d files found", n_dirs,
          n_files);
    negative_control();
    return test_summary("test_layers");
}
