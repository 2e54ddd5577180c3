/* tasks.c - the task registry: the tasks in order, lookup, names and
 * option parsing. Each task is in its own file, task_NAME.c (formats in
 * tasks.h); what they share, and the task set's entry points, is
 * task_impl.c. The task files never call this file, so the registry's
 * references to them are the only edges between the two.
 */
#include "eval/tasks.h"
#include "util/err.h"
#include "util/names.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- registry ------------------------------------------------------------ */

/* Order: the help lists and `sparq eval --help`. */
static const task_def *const registry[] = {
    &task_def_squad, &task_def_triviaqa, &task_def_cnndm, &task_def_wikitext,
    &task_def_repetition, &task_def_niah, &task_def_kvret, &task_def_fidelity,
};
enum { N_TASKS = sizeof registry / sizeof registry[0] };

int task_def_count(void)
{
    return N_TASKS;
}

const task_def *task_def_at(int i)
{
    return i >= 0 && i < N_TASKS ? registry[i] : NULL;
}

const task_def *task_find(const char *name)
{
    for (int i = 0; name && i < N_TASKS; i++)
        if (strcmp(name, registry[i]->name) == 0) return registry[i];
    return NULL;
}

static const char *task_name(int i) { return registry[i]->name; }

const char *task_names(char *buf, size_t size, const char *sep)
{
    return names_join(buf, size, sep, N_TASKS, task_name);
}

const task_option *task_option_find(const task_def *t, const char *name)
{
    for (const task_option *o = t ? t->options : NULL; o && o->name; o++)
        if (strcmp(o->name, name) == 0) return o;
    return NULL;
}

int task_option_set(task_params *p, const task_option *o, const char *value, char *err, size_t err_size)
{
    void *dst = (char *)p + o->offset;
    if (o->type == TASK_OPT_LIST) {
        if (!value[0]) return err_set(err, err_size, "%s needs a value", o->name);
        *(const char **)dst = value;
        return 0;
    }
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    const long long max = o->type == TASK_OPT_INT ? 2147483647LL : INT64_MAX;
    if (end == value || *end || errno || v > max)
        return err_set(err, err_size, "%s: '%s' is not an integer", o->name, value);
    if (v < o->min) return err_set(err, err_size, "%s must be >= %lld, not %lld", o->name, (long long)o->min, v);
    if (o->type == TASK_OPT_INT) *(int *)dst = (int)v;
    else *(int64_t *)dst = v;
    return 0;
}
