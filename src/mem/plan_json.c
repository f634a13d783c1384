/* strata: `strata plan --json` (st_plan_json()). */
#include "plan_internal.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>

static json_object *ju(uint64_t v)
{
	return json_object_new_int64((int64_t)v);
}

/* "activations": where the checkpoints live and what moving them costs. */
static json_object *act_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "home", json_object_new_string(st_home_name(p->act_home)));
	json_object_object_add(o, "checkpoints", json_object_new_int(p->units - 1));
	json_object_object_add(o, "each_bytes", ju(p->act_each_bytes));
	json_object_object_add(o, "vram_bytes", ju(p->act_bytes));
	json_object_object_add(o, "slots", json_object_new_int(p->act_slots));
	json_object_object_add(o, "offloaded", json_object_new_int(p->act_offloaded));
	json_object_object_add(o, "host_bytes", ju(p->act_host_bytes));
	json_object_object_add(o, "copy_bytes_per_micro_batch", ju(p->act_copy_bytes));
	return o;
}

/* "model": its shape, parameters and units. */
static json_object *model_json(const struct st_plan *p, const struct st_plan_input *in)
{
	const struct st_model_config *cfg = st_model_config(in->model);
	json_object *o = json_object_new_object();

	json_object_object_add(o, "layers", json_object_new_int(cfg->n_layer));
	json_object_object_add(o, "dim", json_object_new_int(cfg->dim));
	json_object_object_add(o, "heads", json_object_new_int(cfg->n_head));
	json_object_object_add(o, "vocab", json_object_new_int(cfg->vocab));
	json_object_object_add(o, "ctx", json_object_new_int(cfg->ctx));
	json_object_object_add(o, "params", ju(st_model_param_count(in->model)));
	json_object_object_add(o, "units", json_object_new_int(p->units));
	return o;
}

/* "zero" (world > 1): the rank, the stage and the collectives of a step. */
static json_object *zero_json(const struct st_plan *p)
{
	static const char *kinds[] = { "allreduce", "reduce_scatter", "allgather",
				       "alltoall", "broadcast" };
	json_object *o = json_object_new_object(), *o2;

	json_object_object_add(o, "world", json_object_new_int(p->world));
	json_object_object_add(o, "rank", json_object_new_int(p->rank));
	json_object_object_add(o, "stage", json_object_new_int(p->zero));
	o2 = json_object_new_object();
	for (int k = 0; k < 5; k++) {
		json_object *cell;

		if (!p->comm_calls[k])
			continue;
		cell = json_object_new_object();
		json_object_object_add(cell, "calls", ju(p->comm_calls[k]));
		json_object_object_add(cell, "bytes", ju(p->comm_bytes[k]));
		json_object_object_add(o2, kinds[k], cell);
	}
	json_object_object_add(o, "comm", o2);
	json_object_object_add(o, "net_s", json_object_new_double(p->t_net_s));
	json_object_object_add(o, "net_bps", json_object_new_double(p->rates.net_bps));
	return o;
}

/* "placement": state -> tier -> {units, bytes} */
static json_object *placement_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object(), *o2;

	for (int s = 0; s < ST_STATE_COUNT; s++) {
		o2 = json_object_new_object();
		for (int h = 0; h < ST_HOME_COUNT; h++) {
			int units;
			uint64_t bytes;
			json_object *cell = json_object_new_object();

			char r[1024];

			st_plan_count(p, (enum st_state)s, (enum st_home)h, &units, &bytes);
			st_plan_unit_ranges(p, (enum st_state)s, (enum st_home)h, r, sizeof(r));
			json_object_object_add(cell, "units", json_object_new_int(units));
			json_object_object_add(cell, "bytes", ju(bytes));
			json_object_object_add(cell, "unit_ranges", json_object_new_string(r));
			json_object_object_add(o2, st_home_name((enum st_home)h), cell);
		}
		json_object_object_add(o, st_state_name((enum st_state)s), o2);
	}
	return o;
}

/* "units": each unit's kind, elements, keep, and every state's tier and bytes. */
static json_object *units_json(const struct st_plan *p, const struct st_plan_input *in)
{
	json_object *arr = json_object_new_array(), *o, *o2;

	for (int u = 0; u < p->units; u++) {
		const struct st_unit_layout *l = st_model_unit_layout(in->model, u);

		o = json_object_new_object();
		json_object_object_add(o, "unit", json_object_new_int(u));
		json_object_object_add(o, "kind", json_object_new_string(st_plan_kind_name(l->kind)));
		json_object_object_add(o, "elems", ju(l->elems));
		json_object_object_add(o, "keep", json_object_new_boolean(p->keep[u]));
		for (int s = 0; s < ST_STATE_COUNT; s++) {
			o2 = json_object_new_object();
			json_object_object_add(o2, "tier", json_object_new_string(
				st_home_name(st_plan_home(p, u, (enum st_state)s))));
			json_object_object_add(o2, "bytes",
					       ju(p->state_bytes[u * ST_STATE_COUNT + s]));
			json_object_object_add(o, st_state_name((enum st_state)s), o2);
		}
		json_object_array_add(arr, o);
	}
	return arr;
}

/* "recompute": the mode, the units that keep their forward */
static json_object *recompute_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object(), *arr;

	json_object_object_add(o, "mode", json_object_new_string(st_recompute_name(p->recompute)));
	arr = json_object_new_array();
	for (int u = 0; u < p->units; u++)
		if (p->keep[u])
			json_object_array_add(arr, json_object_new_int(u));
	json_object_object_add(o, "keep", arr);
	json_object_object_add(o, "saved_each_bytes", ju(p->saved_each_bytes));
	json_object_object_add(o, "saved_bytes",
			       ju(st_plan_page_bytes(p->saved_each_bytes) * (uint64_t)p->n_keep));
	json_object_object_add(o, "recompute_flops", json_object_new_double(p->recompute_flops));
	return o;
}

/* "pools": the summary `strata plan` prints. */
static json_object *pools_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "w_slots", ju(p->w_slots));
	json_object_object_add(o, "w_slot_bytes", ju(p->w_slot_bytes));
	json_object_object_add(o, "embed_slot_bytes", ju(p->embed_slot_bytes));
	json_object_object_add(o, "act_bytes", ju(p->act_bytes));
	json_object_object_add(o, "scratch_bytes", ju(p->scratch_bytes));
	json_object_object_add(o, "w_staging_bytes", ju(p->w_staging_bytes));
	json_object_object_add(o, "grad_landing_bytes", ju(p->grad_landing_bytes));
	json_object_object_add(o, "update_staging_bytes", ju(p->update_staging_bytes));
	return o;
}

/* "pool_list": every pool the engine allocates, in its order */
static json_object *pool_list_json(const struct st_plan *p)
{
	json_object *arr = json_object_new_array(), *o;

	for (int i = 0; i < p->n_pools; i++) {
		const struct st_plan_pool *x = &p->pools[i];

		o = json_object_new_object();
		json_object_object_add(o, "name", json_object_new_string(x->name));
		json_object_object_add(o, "tier", json_object_new_string(st_home_name(x->tier)));
		json_object_object_add(o, "bytes", ju(x->bytes));
		json_object_object_add(o, "count", json_object_new_int((int)x->count));
		if (x->unit >= 0)
			json_object_object_add(o, "unit", json_object_new_int(x->unit));
		json_object_array_add(arr, o);
	}
	return arr;
}

/* "tiers": each tier's homes, total, budget and minimum. */
static json_object *tiers_json(const struct st_plan *p, const struct st_plan_input *in)
{
	json_object *o = json_object_new_object(), *o2;

	for (int h = 0; h < ST_HOME_COUNT; h++) {
		if (h == ST_HOME_NVME && !in->have_nvme)
			continue;
		o2 = json_object_new_object();
		json_object_object_add(o2, "home_bytes", ju(p->home_bytes[h]));
		json_object_object_add(o2, "total_bytes", ju(p->total_bytes[h]));
		json_object_object_add(o2, "budget_bytes", ju(p->budget_bytes[h]));
		json_object_object_add(o2, "min_bytes", ju(p->min_bytes[h]));
		if (h == ST_HOME_NVME)
			json_object_object_add(o2, "budget_unlimited",
					       json_object_new_boolean(!in->nvme_mem_bytes));
		json_object_object_add(o, st_home_name((enum st_home)h), o2);
	}
	return o;
}

/* "traffic": the bytes of one step on each link, and the update's. */
static json_object *traffic_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "h2d_bytes", ju(p->h2d_bytes));
	json_object_object_add(o, "d2h_bytes", ju(p->d2h_bytes));
	json_object_object_add(o, "nvme_read_bytes", ju(p->nvme_read_bytes));
	json_object_object_add(o, "nvme_write_bytes", ju(p->nvme_write_bytes));
	json_object_object_add(o, "update_h2d_bytes", ju(p->upd_h2d_bytes));
	json_object_object_add(o, "update_nvme_read_bytes", ju(p->upd_nvme_read_bytes));
	json_object_object_add(o, "update_prefetch_nvme_read_bytes",
			       ju(p->upd_prefetch_nvme_read_bytes));
	json_object_object_add(o, "update_nvme_write_bytes", ju(p->upd_nvme_write_bytes));
	json_object_object_add(o, "update_fwd_nvme_read_bytes", ju(p->upd_fwd_nvme_read_bytes));
	json_object_object_add(o, "update_fwd_h2d_bytes", ju(p->upd_fwd_h2d_bytes));
	json_object_object_add(o, "bwd_ahead_nvme_read_bytes", ju(p->bwd_ahead_nvme_read_bytes));
	json_object_object_add(o, "widen_bytes", ju(p->widen_bytes));
	return o;
}

/* "rates": the prediction's rates and where each came from. */
static json_object *rates_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object(), *o2;

	for (int i = 0; i < ST_RATE_COUNT; i++)
		json_object_object_add(o, st_rate_key((enum st_rate)i),
				       json_object_new_double(st_plan_rate_get(&p->rates,
									   (enum st_rate)i)));
	o2 = json_object_new_object();
	for (int i = 0; i < ST_RATE_COUNT; i++)
		json_object_object_add(o2, st_rate_key((enum st_rate)i),
				       json_object_new_string(st_plan_rate_source(p, (enum st_rate)i)));
	json_object_object_add(o, "source", o2);
	return o;
}

/* "time": the predicted lanes, the step and its two phases. */
static json_object *time_json(const struct st_plan *p, const struct st_plan_input *in)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "compute_s", json_object_new_double(p->t_compute_s));
	json_object_object_add(o, "copy_s", json_object_new_double(p->t_copy_s));
	json_object_object_add(o, "nvme_s", json_object_new_double(p->t_nvme_s));
	json_object_object_add(o, "adam_s", json_object_new_double(p->t_adam_s));
	json_object_object_add(o, "net_s", json_object_new_double(p->t_net_s));
	json_object_object_add(o, "serial_s", json_object_new_double(p->t_serial_s));
	json_object_object_add(o, "step_s", json_object_new_double(p->t_step_s));
	json_object_object_add(o, "bound", json_object_new_string(p->bound));
	json_object_object_add(o, "host_compute", json_object_new_boolean(in->host_compute));
	json_object_object_add(o, "compute_flops", json_object_new_double(p->compute_flops_step));
	json_object_object_add(o, "widen_s", json_object_new_double(p->t_widen_s));
	json_object_object_add(o, "sums_s", json_object_new_double(p->t_sums_s));
	json_object_object_add(o, "adam_bytes", ju(p->adam_bytes));
	{
		static const char *ph_names[2] = { "backward", "update" };
		static const char *lane_keys[5] = { "compute_s", "copy_s", "nvme_s", "adam_s",
						    "net_s" };
		json_object *arr = json_object_new_array();

		for (int ph = 0; ph < 2; ph++) {
			json_object *q = json_object_new_object(), *l = json_object_new_object();

			json_object_object_add(q, "phase", json_object_new_string(ph_names[ph]));
			json_object_object_add(q, "s", json_object_new_double(p->t_phase_s[ph]));
			json_object_object_add(q, "bound", json_object_new_string(p->phase_bound[ph]));
			for (int i = 0; i < 5; i++)
				json_object_object_add(l, lane_keys[i],
						       json_object_new_double(p->t_phase_lane_s[ph][i]));
			json_object_object_add(q, "lanes", l);
			json_object_array_add(arr, q);
		}
		json_object_object_add(o, "phases", arr);
	}
	return o;
}

/* "hide": the batch that hides the I/O */
static json_object *hide_json(const struct st_plan *p)
{
	json_object *o = json_object_new_object();

	json_object_object_add(o, "accum_max", json_object_new_int(ST_PLAN_ACCUM_MAX));
	json_object_object_add(o, "compute_bound_accum", p->hide_accum ?
			       json_object_new_int(p->hide_accum) : NULL);
	json_object_object_add(o, "compute_bound_step_s", p->hide_accum ?
			       json_object_new_double(p->hide_step_s) : NULL);
	json_object_object_add(o, "auto_accum", json_object_new_int(p->hide_best_accum));
	json_object_object_add(o, "auto_step_s", json_object_new_double(p->hide_best_step_s));
	json_object_object_add(o, "why_not", p->hide_accum ? NULL :
			       json_object_new_string(p->hide_why));
	return o;
}

char *st_plan_json(const struct st_plan *p, const struct st_plan_input *in)
{
	json_object *root = json_object_new_object();
	char *text;

	json_object_object_add(root, "model", model_json(p, in));
	json_object_object_add(root, "batch", json_object_new_int(in->batch));
	json_object_object_add(root, "seq", json_object_new_int(in->seq));
	json_object_object_add(root, "grad_accum", json_object_new_int(in->grad_accum));
	json_object_object_add(root, "precision", json_object_new_string(in->bf16 ? "bf16" : "fp32"));
	if (in->model && st_model_precision(in->model) != ST_PRECISION_FP32)
		json_object_object_add(root, "compute_dtype", json_object_new_string(
						     st_precision_name(st_model_precision(in->model))));
	json_object_object_add(root, "prefetch", json_object_new_int(p->prefetch));
	if (p->world > 1)
		json_object_object_add(root, "zero", zero_json(p));
	json_object_object_add(root, "placement", placement_json(p));
	json_object_object_add(root, "split", json_object_new_boolean(p->split));
	json_object_object_add(root, "units", units_json(p, in));
	json_object_object_add(root, "recompute", recompute_json(p));
	json_object_object_add(root, "schedule",
			       json_object_new_string(st_schedule_name(p->schedule)));
	json_object_object_add(root, "schedule_why", json_object_new_string(p->schedule_why));
	json_object_object_add(root, "update", json_object_new_string(
						       p->in_backward ? "in-backward" : "after"));
	json_object_object_add(root, "update_why", json_object_new_string(p->update_why));
	json_object_object_add(root, "alt_nvme_bytes", json_object_new_int64((int64_t)p->alt_bytes));
	json_object_object_add(root, "pools", pools_json(p));
	json_object_object_add(root, "activations", act_json(p));
	json_object_object_add(root, "pool_list", pool_list_json(p));
	json_object_object_add(root, "tiers", tiers_json(p, in));
	json_object_object_add(root, "traffic", traffic_json(p));
	json_object_object_add(root, "rates", rates_json(p));
	json_object_object_add(root, "time", time_json(p, in));
	json_object_object_add(root, "hide", hide_json(p));

	text = strdup(json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY |
							     JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(root);
	return text;
}
