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
 *   - the project headers' include graph has no cycle;
 *   - within each layer, the module graph has no cycle: a module is a .c
 *     (or .cc) and the .h of the same stem (attn/attn.c + attn/attn.h), and
 *     module A uses module B when a file of A includes B's header. Two
 *     modules that use each other are one tangle that can only be read,
 *     tested and replaced together; what both need goes in a lower header
 *     (a kernel twin includes its kernel header, never its dispatcher's).
 *     A circle is reported by its modules' names, "attn/a -> attn/b ->
 *     attn/a". Only a call through a header of another stem escapes this
 *     check, so a .c declares what it offers in its own header.
 *   - the calls agree: from the compiled objects of the build (nm on
 *     BUILD/obj, SPARQ_BUILD, default build), module A calls B when A's
 *     object needs a symbol B's defines; no call goes to a layer A may not
 *     include, and within a layer the calls go round no circle (a registry
 *     called back by what it lists, a twin calling its dispatcher's file),
 *     except the tangles listed in known_tangles, each with its reason.
 * The layer order is written here a second time, on purpose: a change to it
 * must be made in src/README.md and here, not slip in with an include.
 * A planted tree of violations (one per rule) must make every rule fire,
 * the circle finder must name the circle of a small graph in memory, and
 * the call graph built from nm output written in the test must show its
 * tangle, its upward call and, without the call back, no tangle.
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

/* The module graph of the scan (edges only within a layer). */
enum { MAX_MOD = 512, MAX_DEP = 48 };
typedef struct module {
    char name[128];          /* "dir/stem"                                  */
    int  dep[MAX_DEP];       /* modules of its layer it includes            */
    int  n_dep;
    int  mark;               /* depth-first search: 0 new, 1 on path, 2 done */
} module;
typedef struct mod_graph {
    module m[MAX_MOD];
    int    n;
} mod_graph;
static mod_graph mods;

/* Include edges of src/ that are known circles, each with the reason it is
 * allowed for now. An entry whose edge is gone is a failure (delete it), so
 * the list only shrinks; any other circle fails. */
static const struct { const char *from, *to, *why; } known_edges[] = {
    { "", "", "" }, /* none today (a placeholder: C has no empty array) */
};
enum { N_KNOWN = sizeof known_edges / sizeof known_edges[0] };
static int known_seen[N_KNOWN];

static int mod_get(mod_graph *g, const char *name)
{
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->m[i].name, name)) return i;
    if (g->n == MAX_MOD) return -1;
    module *m = &g->m[g->n];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return g->n++;
}

/* from uses to (names "dir/stem"); a module including its own header is no
 * edge. */
static void mod_edge(mod_graph *g, const char *from, const char *to)
{
    if (!strcmp(from, to)) return;
    const int a = mod_get(g, from), b = mod_get(g, to);
    if (a < 0 || b < 0) return;
    module *m = &g->m[a];
    for (int i = 0; i < m->n_dep; i++)
        if (m->dep[i] == b) return;
    if (m->n_dep < MAX_DEP) m->dep[m->n_dep++] = b;
}

/* "dir/stem" of a file name: the extension (.c, .h, .cc) dropped. */
static void mod_name(const char *dir, const char *file, char *out, size_t size)
{
    const char *dot = strrchr(file, '.');
    const int len = dot ? (int)(dot - file) : (int)strlen(file);
    snprintf(out, size, "%.60s/%.*s", dir, len < 60 ? len : 60, file);
}

typedef void (*circle_fn)(const char *circle, void *user);

/* Depth-first search from u; every edge back to a module on the current
 * path closes a circle, passed to report as "a -> b -> a". Returns the
 * circles found. */
static int mod_dfs(mod_graph *g, int u, int *path, int depth, circle_fn report, void *user)
{
    int found = 0;
    g->m[u].mark = 1;
    path[depth] = u;
    for (int i = 0; i < g->m[u].n_dep; i++) {
        const int v = g->m[u].dep[i];
        if (g->m[v].mark == 1) {
            char text[2048];
            size_t l = 0;
            int j = depth;
            while (path[j] != v) j--;
            for (; j <= depth && l < sizeof text; j++)
                l += (size_t)snprintf(text + l, sizeof text - l, "%s -> ", g->m[path[j]].name);
            if (l < sizeof text) snprintf(text + l, sizeof text - l, "%s", g->m[v].name);
            report(text, user);
            found++;
        } else if (g->m[v].mark == 0) {
            found += mod_dfs(g, v, path, depth + 1, report, user);
        }
    }
    g->m[u].mark = 2;
    return found;
}

/* Every circle of g (at least one per tangle), through report. */
static int mod_circles(mod_graph *g, circle_fn report, void *user)
{
    static int path[MAX_MOD];
    int found = 0;
    for (int i = 0; i < g->n; i++) g->m[i].mark = 0;
    for (int i = 0; i < g->n; i++)
        if (g->m[i].mark == 0) found += mod_dfs(g, i, path, 0, report, user);
    return found;
}

static void circle_violation(const char *circle, void *user)
{
    (void)user;
    VIOLATION("module circle: %s (each includes the other's header, directly or through "
              "others; put what both need in a lower header)", circle);
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
        if (!angle && !strcmp(idir, dir)) {
            char from[128], to[128];
            mod_name(dir, file, from, sizeof from);
            mod_name(idir, ifile, to, sizeof to);
            int known = 0;
            for (int k = 0; k < N_KNOWN; k++)
                if (!strcmp(known_edges[k].from, from) && !strcmp(known_edges[k].to, to))
                    known = known_seen[k] = 1;
            if (!known) mod_edge(&mods, from, to);
        }
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
    mods.n = 0;
    memset(known_seen, 0, sizeof known_seen);
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
    mod_circles(&mods, circle_violation, NULL);
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
        /* 2: a header cycle, which is also a module circle */
        { "index/p.h", "#include \"index/q.h\"\n" },
        { "index/q.h", "#include \"p.h\"\n" },
        /* 1: a module circle through the .c files alone */
        { "core/m1.h", "" },
        { "core/m2.h", "" },
        { "core/m1.c", "#include \"core/m1.h\"\n#include \"core/m2.h\"\n" },
        { "core/m2.c", "#include \"m1.h\"\n" },
        /* allowed: twins and their dispatcher over one kernel header */
        { "tensor/k_kernels.h", "" },
        { "tensor/k.h", "" },
        { "tensor/k.c", "#include \"tensor/k.h\"\n#include \"tensor/k_kernels.h\"\n" },
        { "tensor/k_avx2.c", "#include \"tensor/k_kernels.h\"\n" },
    };
    enum { EXPECTED = 10 };
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

static void collect_circle(const char *circle, void *user)
{
    char *out = user;
    if (!out[0]) snprintf(out, 512, "%s", circle);
}

/* The circle finder on graphs in memory: a -> b -> c -> a with d -> a
 * hanging off it is one circle, named in order; without c -> a there is
 * none; a module including its own header is no edge. */
static void circle_control(void)
{
    static mod_graph g;
    char first[512] = "";
    g.n = 0;
    mod_edge(&g, "x/a", "x/b");
    mod_edge(&g, "x/b", "x/c");
    mod_edge(&g, "x/c", "x/a");
    mod_edge(&g, "x/d", "x/a");
    mod_edge(&g, "x/e", "x/e");
    int n = mod_circles(&g, collect_circle, first);
    CHECK(n == 1 && !strcmp(first, "x/a -> x/b -> x/c -> x/a"),
          "circle control: %d circles, first \"%s\"", n, first);
    g.n = 0;
    first[0] = 0;
    mod_edge(&g, "x/a", "x/b");
    mod_edge(&g, "x/b", "x/c");
    mod_edge(&g, "x/d", "x/a");
    mod_edge(&g, "x/e", "x/e");
    n = mod_circles(&g, collect_circle, first);
    CHECK(n == 0, "circle control: a graph without a circle reported %d (\"%s\")", n, first);
}

/* ---- The call graph of the compiled objects ----------------------------
 *
 * Includes show only the calls a header of the callee's stem declares; a
 * module can still call one that includes it through a declaration in
 * some other header, a registry be called back by the implementations it
 * lists, a twin call a helper its dispatcher defines. So the objects are
 * read too: `nm -P` on BUILD/obj/LAYER/STEM.o gives what each module
 * defines (global symbols of types T D R B C V W G S) and what it needs
 * (U); module A calls module B when A needs a symbol B defines. Within a
 * layer those calls must not go round a circle; across layers they must go
 * only where includes may (a call up through a private declaration is the
 * same violation as the include). A circle is named by its modules, the
 * shortest one through the first of its tangle. */

enum { CG_MAX = 512 };
typedef struct { char *name; int mod; } cg_sym;
typedef struct call_graph {
    char   mod[CG_MAX][128];     /* "dir/stem"                               */
    int    layer[CG_MAX];        /* index into layers[]                      */
    int    n;
    unsigned char edge[CG_MAX][CG_MAX]; /* edge[a][b]: a calls b             */
    cg_sym *def, *use;           /* every defined / needed global symbol     */
    size_t n_def, n_use, cap_def, cap_use;
    int    n_upward;             /* calls across layers no include may make  */
} call_graph;

/* Tangles of calls (strongly connected modules) that are known, each with
 * why it is allowed for now: "dir" and its modules' stems, sorted, one space
 * apart. A tangle not listed fails, and so does an entry that no longer
 * matches a tangle exactly (one that is gone or changed: edit the list), so
 * the list only shrinks. */
static const struct { const char *dir, *stems, *why; } known_tangles[] = {
    { "", "", "" }, /* none today (a placeholder: C has no empty array) */
};
enum { N_TANGLES = sizeof known_tangles / sizeof known_tangles[0] };

static int cg_module(call_graph *g, int layer, const char *name)
{
    for (int i = 0; i < g->n; i++)
        if (!strcmp(g->mod[i], name)) return i;
    if (g->n == CG_MAX) return -1;
    snprintf(g->mod[g->n], sizeof g->mod[0], "%s", name);
    g->layer[g->n] = layer;
    return g->n++;
}

static int cg_push(cg_sym **v, size_t *n, size_t *cap, const char *name, int mod)
{
    if (*n == *cap) {
        const size_t c = *cap ? 2 * *cap : 1024;
        cg_sym *p = realloc(*v, c * sizeof *p);
        if (!p) return -1;
        *v = p;
        *cap = c;
    }
    char *s = strdup(name);
    if (!s) return -1;
    (*v)[*n].name = s;
    (*v)[(*n)++].mod = mod;
    return 0;
}

/* Reads `nm -P` output ("name type [value size]" a line) for module mod.
 * Returns the number of global symbols read, -1 if out of memory. */
static int cg_read_nm(call_graph *g, int mod, FILE *f)
{
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char name[512], type[8];
        if (sscanf(line, "%511s %7s", name, type) != 2 || type[1]) continue;
        int rc = 0;
        if (type[0] == 'U')
            rc = cg_push(&g->use, &g->n_use, &g->cap_use, name, mod);
        else if (strchr("TDRBCVWGS", type[0]))
            rc = cg_push(&g->def, &g->n_def, &g->cap_def, name, mod);
        else
            continue;               /* lower case: local to its object */
        if (rc) return -1;
        n++;
    }
    return n;
}

static int cg_sym_cmp(const void *a, const void *b)
{
    return strcmp(((const cg_sym *)a)->name, ((const cg_sym *)b)->name);
}

/* Resolves every needed symbol to the module defining it: edges within a
 * layer, upward calls counted (and reported unless quiet). */
static void cg_link(call_graph *g)
{
    qsort(g->def, g->n_def, sizeof *g->def, cg_sym_cmp);
    memset(g->edge, 0, sizeof g->edge);
    g->n_upward = 0;
    for (size_t i = 0; i < g->n_use; i++) {
        const cg_sym *d = bsearch(&g->use[i], g->def, g->n_def, sizeof *g->def, cg_sym_cmp);
        if (!d || d->mod == g->use[i].mod) continue;
        const int a = g->use[i].mod, b = d->mod, la = g->layer[a], lb = g->layer[b];
        if (la == lb) {
            g->edge[a][b] = 1;
        } else if (!(layers[la].may & 1u << lb)) {
            g->n_upward++;
            VIOLATION("%s calls %s of %s (%s), a layer %s may not include (src/README.md)",
                      g->mod[a], d->name, g->mod[b], layers[lb].dir, layers[la].dir);
        }
    }
}

static void cg_free(call_graph *g)
{
    for (size_t i = 0; i < g->n_def; i++) free(g->def[i].name);
    for (size_t i = 0; i < g->n_use; i++) free(g->use[i].name);
    free(g->def);
    free(g->use);
    g->def = g->use = NULL;
    g->n_def = g->n_use = g->cap_def = g->cap_use = 0;
}

/* Tarjan's strongly connected components: comp[v] numbers v's tangle. */
typedef struct { int index[CG_MAX], low[CG_MAX], on[CG_MAX], stack[CG_MAX], comp[CG_MAX];
                 int sp, next, n_comp; } cg_scc;

static void cg_strong(const call_graph *g, cg_scc *s, int v)
{
    s->index[v] = s->low[v] = s->next++;
    s->stack[s->sp++] = v;
    s->on[v] = 1;
    for (int w = 0; w < g->n; w++) {
        if (!g->edge[v][w]) continue;
        if (s->index[w] < 0) {
            cg_strong(g, s, w);
            if (s->low[w] < s->low[v]) s->low[v] = s->low[w];
        } else if (s->on[w] && s->index[w] < s->low[v]) {
            s->low[v] = s->index[w];
        }
    }
    if (s->low[v] == s->index[v]) {
        int w;
        do {
            w = s->stack[--s->sp];
            s->on[w] = 0;
            s->comp[w] = s->n_comp;
        } while (w != v);
        s->n_comp++;
    }
}

static int cg_name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

typedef void (*tangle_fn)(const char *dir, const char *stems, const char *circle, void *user);

/* Every tangle of two or more modules, through report: its folder, its
 * stems sorted ("a b c") and the shortest circle through its first module
 * ("dir/a -> dir/b -> dir/a"). Returns the number of tangles. */
static int cg_tangles(const call_graph *g, tangle_fn report, void *user)
{
    static cg_scc s;
    memset(&s, 0, sizeof s);
    for (int v = 0; v < g->n; v++) s.index[v] = -1;
    for (int v = 0; v < g->n; v++)
        if (s.index[v] < 0) cg_strong(g, &s, v);
    int found = 0;
    for (int c = 0; c < s.n_comp; c++) {
        const char *names[CG_MAX];
        int n = 0;
        for (int v = 0; v < g->n; v++)
            if (s.comp[v] == c) names[n++] = g->mod[v];
        if (n < 2) continue;
        qsort(names, (size_t)n, sizeof names[0], cg_name_cmp);
        char stems[4096] = "", dir[64];
        size_t l = 0;
        const char *slash = strchr(names[0], '/');
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - names[0]), names[0]);
        for (int i = 0; i < n && l < sizeof stems; i++)
            l += (size_t)snprintf(stems + l, sizeof stems - l, "%s%s", i ? " " : "",
                                  strchr(names[i], '/') + 1);
        /* breadth-first from the first module back to itself */
        int first = 0, prev[CG_MAX], queue[CG_MAX];
        while (strcmp(g->mod[first], names[0])) first++;
        int head = 0, tail = 0, last = -1;
        for (int v = 0; v < g->n; v++) prev[v] = -2;
        queue[tail++] = first;
        prev[first] = -1;
        while (head < tail && last < 0) {
            const int u = queue[head++];
            for (int w = 0; w < g->n; w++) {
                if (!g->edge[u][w] || s.comp[w] != c) continue;
                if (w == first) { last = u; break; }
                if (prev[w] == -2) { prev[w] = u; queue[tail++] = w; }
            }
        }
        int path[CG_MAX], len = 0;
        for (int v = last; v >= 0; v = prev[v]) path[len++] = v;
        char circle[4096];
        l = 0;
        for (int i = len - 1; i >= 0 && l < sizeof circle; i--)
            l += (size_t)snprintf(circle + l, sizeof circle - l, "%s -> ", g->mod[path[i]]);
        if (l < sizeof circle) snprintf(circle + l, sizeof circle - l, "%s", g->mod[first]);
        report(dir, stems, circle, user);
        found++;
    }
    return found;
}

static int tangle_seen[N_TANGLES];

static void tangle_violation(const char *dir, const char *stems, const char *circle, void *user)
{
    (void)user; /* a circle reporter: the known tangles need no context */
    for (int k = 0; k < N_TANGLES; k++)
        if (!strcmp(known_tangles[k].dir, dir) && !strcmp(known_tangles[k].stems, stems)) {
            tangle_seen[k] = 1;
            return;
        }
    VIOLATION("call circle: %s (tangle of %s: %s; move what the others call back into "
              "a lower module of its own)", circle, dir, stems);
}

/* The objects of build (BUILD/obj/LAYER/STEM.o, a *_neondp.o being its
 * *_neon.c's second build) whose source is still in src: a stale object
 * of a deleted file is not the tree's. Returns the objects read, -1 if the
 * build cannot be read. */
static int cg_scan(call_graph *g, const char *build, const char *src)
{
    int n_obj = 0;
    for (int li = 0; li < N_LAYERS; li++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%.200s/obj/%s", build, layers[li].dir);
        DIR *d = opendir(dir);
        if (!d) continue;
        struct dirent *fe;
        while ((fe = readdir(d))) {
            const size_t l = strlen(fe->d_name);
            if (l < 3 || strcmp(fe->d_name + l - 2, ".o")) continue;
            char stem[256], path[1024];
            snprintf(stem, sizeof stem, "%.*s", (int)(l - 2) < 200 ? (int)(l - 2) : 200, fe->d_name);
            const size_t sl = strlen(stem);
            if (sl > 7 && !strcmp(stem + sl - 7, "_neondp")) stem[sl - 2] = 0;  /* _neon */
            struct stat st;
            snprintf(path, sizeof path, "%.200s/%s/%s.c", src, layers[li].dir, stem);
            if (stat(path, &st)) {
                snprintf(path, sizeof path, "%.200s/%s/%s.cc", src, layers[li].dir, stem);
                if (stat(path, &st)) continue;
            }
            char name[300], cmd[1200];
            snprintf(name, sizeof name, "%s/%s", layers[li].dir, stem);
            const int m = cg_module(g, li, name);
            if (m < 0) break;
            snprintf(cmd, sizeof cmd, "nm -P '%s/%s'", dir, fe->d_name);
            FILE *p = popen(cmd, "r");
            CHECK(p != NULL, "cannot run %s", cmd);
            if (!p) continue;
            const int n = cg_read_nm(g, m, p);
            const int rc = pclose(p);
            CHECK(n >= 0 && rc == 0, "%s failed (exit %d) or ran out of memory", cmd, rc);
            n_obj++;
        }
        closedir(d);
    }
    return n_obj;
}

static void collect_tangle(const char *dir, const char *stems, const char *circle, void *user)
{
    char *out = user;
    if (!out[0]) snprintf(out, 512, "%s: %s: %s", dir, stems, circle);
}

/* The call graph from nm output written here: a -> b -> c -> a (b calls
 * back into a, c into a) with d hanging off it is one tangle, named with
 * its shortest circle; a call of a module's own symbol and an undefined
 * symbol nobody defines are no edges; an upward call is a violation; with
 * c's call back removed there is no tangle. */
static void call_control(void)
{
    static call_graph g;
    static const struct { const char *mod, *nm; } objs[] = {
        { "attn/a", "a_run T 0 10\nb_step U\nmemcpy U\na_table D 40 8\n" },
        { "attn/b", "b_step T 0 10\nc_help U\nlocal_fn t 20 4\n" },
        { "attn/c", "c_help T 0 10\na_run U\n" },
        { "attn/d", "d_main T 0 10\na_run U\nd_main U\n" },
        { "tensor/t", "t_up T 0 10\nd_main U\n" },
    };
    char first[512] = "";
    for (int pass = 0; pass < 2; pass++) {
        memset(&g, 0, sizeof g);
        for (size_t i = 0; i < sizeof objs / sizeof objs[0]; i++) {
            char dir[16];
            snprintf(dir, sizeof dir, "%.*s", (int)(strchr(objs[i].mod, '/') - objs[i].mod),
                     objs[i].mod);
            const int m = cg_module(&g, layer_index(dir), objs[i].mod);
            const char *text = pass == 1 && !strcmp(objs[i].mod, "attn/c") ? "c_help T 0 10\n"
                                                                           : objs[i].nm;
            FILE *f = fmemopen((void *)text, strlen(text), "r");
            CHECK(f != NULL, "fmemopen failed");
            if (!f) return;
            cg_read_nm(&g, m, f);
            fclose(f);
        }
        quiet = 1;
        cg_link(&g);
        quiet = 0;
        first[0] = 0;
        const int n = cg_tangles(&g, collect_tangle, first);
        if (pass == 0)
            CHECK(n == 1 && !strcmp(first, "attn: a b c: attn/a -> attn/b -> attn/c -> attn/a") &&
                      g.n_upward == 1 && !g.edge[3][3] && g.edge[3][0],
                  "call control: %d tangles, first \"%s\", %d upward calls", n, first,
                  g.n_upward);
        else
            CHECK(n == 0, "call control: a graph without a circle gave %d (\"%s\")", n, first);
        cg_free(&g);
    }
}

/* The tree's call graph from the objects of the build the test belongs to. */
static void check_calls(const char *src)
{
    static call_graph g;
    const char *build = getenv("SPARQ_BUILD") ? getenv("SPARQ_BUILD") : "build";
    memset(&g, 0, sizeof g);
    const int n_obj = cg_scan(&g, build, src);
    cg_link(&g);
    size_t n_edges = 0;
    for (int a = 0; a < g.n; a++)
        for (int b = 0; b < g.n; b++) n_edges += g.edge[a][b];
    CHECK(n_obj >= 50 && n_edges >= 50,
          "only %d objects and %zu calls within layers read from %s/obj (build first)", n_obj,
          n_edges, build);
    cg_tangles(&g, tangle_violation, NULL);
    for (int k = 0; k < N_TANGLES; k++)
        CHECK(tangle_seen[k] || !known_tangles[k].dir[0],
              "known call tangle %s: %s is gone or changed: edit known_tangles",
              known_tangles[k].dir, known_tangles[k].stems);
    cg_free(&g);
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
    for (int k = 0; k < N_KNOWN; k++)
        CHECK(!known_edges[k].from[0] || known_seen[k], "known circle edge %s -> %s is gone: delete it from known_edges",
              known_edges[k].from, known_edges[k].to);
    CHECK(n_dirs >= 8 && n_files >= 50, "only %d layer folders and %d files found", n_dirs,
          n_files);
    check_calls(src);
    negative_control();
    circle_control();
    call_control();
    return test_summary("test_layers");
}
