/* The cost of every layer: parameters, FLOPs and activation bytes per token, from the
 * description alone. `trainer show`, the MFU figure and (later) the planner all read these;
 * model.c's measuring pass allocates exactly the activations counted here. */
#include "model/model.h"

static void cost_add(tr_cost *a, const tr_cost *b, double times) {
    a->params += b->params * times;
    a->matrix_params += b->matrix_params * times;
    a->param_bytes += b->param_bytes * times;
    a->grad_bytes += b->grad_bytes * times;
    a->optim_bytes += b->optim_bytes * times;
    a->fwd_flops += b->fwd_flops * times;
    a->act_bytes += b->act_bytes * times;
    a->act_split_bytes += b->act_split_bytes * times;
    a->act_sel_bytes += b->act_sel_bytes * times;
    a->residuals += b->residuals * times;
    a->matrix_ops += b->matrix_ops * times;
}

void tr_cost_node(const tr_model_desc *d, const tr_node *n, int T, tr_cost *out) {
    const double C = d->dim, V = d->vocab, F = 4.0; /* F: bytes per float */
    tr_cost c = {0};
    switch (n->kind) {
    case TR_NODE_SEQUENCE:
    case TR_NODE_STACK:
    case TR_NODE_RESIDUAL:
        for (int i = 0; i < n->n_children; i++) {
            tr_cost k;
            tr_cost_node(d, &n->children[i], T, &k);
            cost_add(&c, &k, 1);
        }
        if (n->kind == TR_NODE_STACK) {
            tr_cost once = c;
            c = (tr_cost){0};
            cost_add(&c, &once, n->repeat);
        }
        if (n->kind == TR_NODE_RESIDUAL) {
            c.act_bytes += F * C; /* the sum */
            c.residuals += 1;
        }
        break;
    case TR_NODE_EMBEDDING:
        c.params = c.matrix_params = V * C;
        c.act_bytes = F * C;
        break;
    case TR_NODE_POSITIONS: /* added in place to the embedding output */
        c.params = c.matrix_params = (double)d->seq_len * C;
        break;
    case TR_NODE_ROPE:
        break;
    case TR_NODE_LAYERNORM:
        c.params = C * (n->bias ? 2 : 1);
        c.act_bytes = F * (C + 2); /* output, mean, rstd */
        break;
    case TR_NODE_RMSNORM:
        c.params = C;
        c.act_bytes = F * (C + 1);
        break;
    case TR_NODE_ATTENTION: {
        double hd = C / n->heads, q = n->heads * hd, qkv = (n->heads + 2.0 * n->kv_heads) * hd;
        c.matrix_params = qkv * C + C * q;
        c.params = c.matrix_params + (n->bias ? qkv + C : 0);
        /* projections, then QK^T and PV over the causal half: query t sees t+1 keys */
        c.fwd_flops = 2 * C * qkv + 2 * q * C + 2.0 * 2.0 * q * (T + 1) / 2.0;
        c.act_bytes = F * (qkv + q + n->heads + C); /* qkv, attention out, lse, output */
        c.act_split_bytes = F * (qkv + q + n->heads);
        c.matrix_ops = 4; /* qkv, scores, values, output */
        break;
    }
    case TR_NODE_MLP: {
        double h = n->hidden, fc = n->activation == TR_ACT_SWIGLU ? 2 * h : h;
        c.matrix_params = fc * C + C * h;
        c.params = c.matrix_params + (n->bias ? fc + C : 0);
        c.fwd_flops = 2 * C * fc + 2 * h * C;
        c.act_bytes = F * (fc + h + C); /* pre-activation, activation, output */
        c.act_split_bytes = F * (fc + h);
        c.act_sel_bytes = F * h;
        c.matrix_ops = 2;
        break;
    }
    case TR_NODE_LM_HEAD:
        c.params = c.matrix_params = n->tied ? 0 : V * C;
        c.fwd_flops = 2 * C * V;
        c.act_bytes = F * (1 + C); /* per-token loss, gradient seeded into the stream */
        c.matrix_ops = 1;
        break;
    case TR_NODE_KIND_COUNT:
        break;
    }
    if (n->kind != TR_NODE_SEQUENCE && n->kind != TR_NODE_STACK && n->kind != TR_NODE_RESIDUAL) {
        c.param_bytes = F * c.params; /* fp32 weights, gradients, and Adam's m and v */
        c.grad_bytes = F * c.params;
        c.optim_bytes = 2 * F * c.params;
    }
    *out = c;
}

void tr_cost_model(const tr_model_desc *d, int T, tr_cost *out) {
    tr_cost_node(d, &d->root, T, out);
}

int tr_cost_blocks(const tr_model_desc *d, int T, tr_cost *out, int max) {
    const tr_node *root = &d->root;
    int n = 0; /* blocks started so far; layers before the first one join block 0 */
    tr_cost pending = {0};
    for (int i = 0; i < root->n_children; i++) {
        const tr_node *c = &root->children[i];
        if (c->kind == TR_NODE_STACK) {
            tr_cost once = {0}, k;
            for (int j = 0; j < c->n_children; j++) {
                tr_cost_node(d, &c->children[j], T, &k);
                cost_add(&once, &k, 1);
            }
            for (int r = 0; r < c->repeat; r++, n++) {
                if (out && n < max) {
                    out[n] = once;
                    if (n == 0) cost_add(&out[n], &pending, 1);
                }
            }
            continue;
        }
        tr_cost k;
        tr_cost_node(d, c, T, &k);
        if (n == 0)
            cost_add(&pending, &k, 1);
        else if (out && n - 1 < max)
            cost_add(&out[n - 1], &k, 1);
    }
    if (n == 0) { /* no stack: one block, the whole model */
        if (out && max > 0) out[0] = pending;
        return 1;
    }
    return n;
}

double tr_cost_train_flops_per_token(const tr_model_desc *d, int T) {
    tr_cost c;
    tr_cost_model(d, T, &c);
    return 3.0 * c.fwd_flops;
}
