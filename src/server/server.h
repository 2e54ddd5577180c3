/* server.h - `sparq serve`: an OpenAI-compatible HTTP server over one model
 * with continuous batching (server.c: HTTP and JSON; sched.c: the
 * scheduler thread that prefills and decodes the running sequences).
 *
 * One scheduler thread owns every context. An HTTP request is parsed and
 * validated on its connection's thread, becomes an srv_request in a bounded
 * queue, and waits for what the scheduler publishes under the server lock
 * (text so far, token log-probabilities, the finish reason). Each admitted
 * request gets its own context (KV cache, attention policy with its own
 * parameters) over the shared model; its prompt is prefilled one n_batch
 * chunk per scheduler round, interleaved with one batched decode step of
 * every running sequence (sparq_decode_batch, batch-invariant), so a
 * request's tokens do not depend on what else the server is doing.
 */
#ifndef SPARQ_SERVER_H
#define SPARQ_SERVER_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "sparq.h"
#include "server/docs.h"
#include "server/srv_config.h"

typedef struct srv_server srv_server;

/* Starts the scheduler and the HTTP daemon; returns NULL with a message. */
srv_server *srv_start(sparq_model *m, const srv_config *cfg, char *err, size_t err_size);
int  srv_port(const srv_server *s);
/* Stops accepting work, waits up to grace seconds for running requests,
 * cancels the rest, and frees everything. */
void srv_stop(srv_server *s, double grace);

#endif
