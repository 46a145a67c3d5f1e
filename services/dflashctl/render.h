/* render: dflashctl's output: the status screen as one table, and any protobuf message as JSON (field names as in
 * proto/dflash.proto, enums by name) for scripts. Writes to a FILE; no state. */
#ifndef DFLASHCTL_RENDER_H
#define DFLASHCTL_RENDER_H

#include <stdio.h>

#include "dflash.pb-c.h"

/* The status screen. */
void render_status(FILE *f, const Dflash__StatusReply *s);
/* One JSON object on one line. */
void render_json(FILE *f, const ProtobufCMessage *m);

#endif
