/* context.h - what context.c offers the rest of core beyond sparq.h.
 */
#ifndef SPARQ_CONTEXT_H
#define SPARQ_CONTEXT_H

#include "core/model.h"

/* After a batch: a cache built in its KV file records how far it got, so
 * a prefill that dies can be resumed (sparq_context_create_in_file). */
void ctx_file_progress(sparq_context *c);

#endif
