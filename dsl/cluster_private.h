/* Private header of the cluster module (dsl/cluster*.c): the figures a group gets when the
 * file does not give them, shared by the command line (cluster.c) and the reader
 * (cluster_yaml.c). The public interface is dsl/cluster.h.
 *   cluster.c        the table of known devices, counting ranks, --gpus, the writer
 *   cluster_yaml.c   the reader of cluster files (libyaml) */
#ifndef TR_CLUSTER_PRIVATE_H
#define TR_CLUSTER_PRIVATE_H

#include "dsl/cluster.h"

#define TR_CLUSTER_MAX_NODES 100000 /* per group */
#define TR_CLUSTER_MAX_PER_NODE 1024
#define TR_UNKNOWN_PER_NODE 8 /* an unknown device's server, assumed */

/* Every figure of g not given (origin other than TR_ORIGIN_GIVEN) from the device d (origin
 * table), or, when d is NULL, from the defaults for an unknown device (origin assumed). */
void tr_group_fill(tr_node_group *g, const tr_device_info *d);

/* Every pair of groups not given gets the slower group's inter-node link (assumed); each
 * group's own pair (i, i) gets its inter-node link. */
void tr_cluster_fill_between(tr_cluster *c);

#endif
