/* The nesting bound of every YAML text the trainer reads (dsl/yaml.h). */
#include "dsl/yaml.h"

#include <yaml.h>

int tr_yaml_too_deep(const char *text, size_t len, int max_depth) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) return -1;
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    int depth = 0, line = 0;
    for (int done = 0; !done && !line;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&p, &e)) break; /* the loader says it */
        if (e.type == YAML_SEQUENCE_START_EVENT || e.type == YAML_MAPPING_START_EVENT) {
            if (++depth > max_depth) line = (int)e.start_mark.line + 1;
        } else if (e.type == YAML_SEQUENCE_END_EVENT || e.type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        done = e.type == YAML_STREAM_END_EVENT;
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&p);
    return line;
}
