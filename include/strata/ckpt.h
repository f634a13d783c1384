/* strata: checkpoint files of the tiered engine (`--save DIR --save-every N
 * --keep K`, `--resume DIR`). Layout and guarantees: docs/checkpoints.md.
 *
 *   DIR/step-000123/model.safetensors      fp32 master weights P (HF names)
 *   DIR/step-000123/optimizer.safetensors  Adam moments: "<name>.exp_avg" (M),
 *                                          "<name>.exp_avg_sq" (V)
 *   DIR/step-000123/config.json            st_model_config_write()
 *   DIR/step-000123/trainer.json           version, step, seed, sampler
 *                                          cursor, training config, and the
 *                                          size + XXH64 of every other file
 *   DIR/latest -> step-000123              symlink, replaced atomically
 *
 * Model state may live on NVMe and not fit in RAM, so nothing here holds a
 * whole file: safetensors are written by pulling each tensor's bytes through
 * a callback in chunks, hashed as they are written, and read back by byte
 * range. A checkpoint is written into DIR/step-N.tmp.<pid>, fsynced, then
 * renamed to DIR/step-N before `latest` moves to it: a crash at any instant
 * leaves `latest` naming a complete checkpoint (or no `latest` at all before
 * the first one), and leftovers of a crashed writer are removed by the next
 * st_ckpt_dir_begin().
 *
 * All functions return 0 or -errno; the detail (naming the file) is in
 * st_error_last(). -EINVAL: bad argument or bad file; -ENOENT: missing file
 * or tensor; -EIO/-ENOSPC/...: the system. */
#ifndef STRATA_CKPT_H
#define STRATA_CKPT_H

#include "strata/common.h"
#include "strata/safetensors.h"

#include <stddef.h>
#include <stdint.h>

/* trainer.json "version" written; a larger one is refused on read.
 * Version 2 adds "checksum" (trainer.json's own); 1 is read without it. */
#define ST_CKPT_VERSION 2

#define ST_CKPT_MODEL_FILE "model.safetensors"
#define ST_CKPT_OPTIM_FILE "optimizer.safetensors"
#define ST_CKPT_CONFIG_FILE "config.json"
#define ST_CKPT_TRAINER_FILE "trainer.json"
#define ST_CKPT_LATEST "latest"
/* DIR/best -> step-N: the checkpoint of the lowest validation loss
 * (strata train --keep-best), never pruned; DIR/best.json says its loss. */
#define ST_CKPT_BEST "best"
#define ST_CKPT_BEST_JSON "best.json"
/* Suffixes of the Adam moments' names in optimizer.safetensors (PyTorch's
 * AdamW state names). The master weights are not repeated there: P is
 * model.safetensors, bit for bit. */
#define ST_CKPT_SUFFIX_EXP_AVG ".exp_avg"
#define ST_CKPT_SUFFIX_EXP_AVG_SQ ".exp_avg_sq"

/* The streaming writer asks for at most this many bytes per fill call and
 * holds one buffer of this size. */
#define ST_CKPT_CHUNK_BYTES (8 * ST_MiB)

/* ---- streamed safetensors -------------------------------------------------- */

/* One tensor of a streamed file: what the header says. The bytes come from
 * the fill callback. name is borrowed. */
struct st_ckpt_tensor {
	const char *name;
	enum st_sf_dtype dtype;
	int ndim;
	uint64_t shape[ST_SF_MAX_DIMS];
};

/* Fill buf with len bytes of tensor tensor_index, starting offset_bytes into
 * that tensor (little-endian, row-major: the file's bytes). Calls come in
 * file order, each within one tensor, len <= ST_CKPT_CHUNK_BYTES; buf is
 * 4 KiB-aligned and len a multiple of 4 KiB except at a tensor's end (so a
 * fill may pread with O_DIRECT from an aligned source). Return 0, or -errno
 * to abandon the file (set the detail with st_error_set(): it is kept). */
typedef int (*st_ckpt_fill_fn)(void *ctx, size_t tensor_index,
			       uint64_t offset_bytes, void *buf, size_t len);

/* Write a safetensors file to path whose bytes are exactly those
 * st_safetensors_write() would write for the same tensors, metadata and data
 * (same header JSON, padding and order), pulling the data through fill in
 * chunks of ST_CKPT_CHUNK_BYTES. Written to a temporary next to path,
 * fsynced, renamed, directory fsynced. out_bytes and out_xxh64 (each may be
 * NULL) get the file's size and XXH64 (seed 0) of the whole file, computed
 * while writing. Names must be unique, non-empty and not "__metadata__";
 * metadata keys unique. Returns 0; -EINVAL for bad arguments (nothing is
 * created); fill's error or -errno from the system (the temporary is removed
 * and path keeps its old contents). */
int st_ckpt_write_safetensors(const char *path,
			      const struct st_ckpt_tensor *tensors, size_t n,
			      const struct st_sf_meta *meta, size_t n_meta,
			      st_ckpt_fill_fn fill, void *ctx,
			      uint64_t *out_bytes, uint64_t *out_xxh64);

/* Size and XXH64 (seed 0) of a whole file, read in chunks of
 * ST_CKPT_CHUNK_BYTES. Returns 0 or -errno. */
int st_ckpt_file_hash(const char *path, uint64_t *out_bytes,
		      uint64_t *out_xxh64);

/* A safetensors file opened for reading tensors by byte range, so a tensor
 * larger than memory is read piece by piece. The header is validated by
 * st_safetensors_open() (which reads only the header). */
struct st_ckpt_reader;

/* Open path. Returns 0 and sets *out, or st_safetensors_open()'s errors. */
int st_ckpt_reader_open(struct st_ckpt_reader **out, const char *path);

/* Close. NULL does nothing. */
void st_ckpt_reader_close(struct st_ckpt_reader *r);

/* The path it was opened with. Borrowed until close. */
const char *st_ckpt_reader_path(const struct st_ckpt_reader *r);

/* The validated file (count, at, metadata...). Borrowed until close. */
const struct st_safetensors *st_ckpt_reader_file(const struct st_ckpt_reader *r);

/* Find tensor name and check that it is dtype with shape[0..ndim). *out is
 * borrowed until close. Returns 0, -ENOENT when there is no such tensor,
 * -EINVAL when its dtype or shape differ (the detail shows both). */
int st_ckpt_reader_find(const struct st_ckpt_reader *r, const char *name,
			enum st_sf_dtype dtype, int ndim, const uint64_t *shape,
			const struct st_sf_info **out);

/* Read len bytes of tensor t (from st_ckpt_reader_find() or the file's
 * st_safetensors_at()) starting offset_bytes into it. Thread-safe (pread).
 * Returns 0, -EINVAL when the range runs past the tensor, -EIO etc. */
int st_ckpt_reader_pread(const struct st_ckpt_reader *r,
			 const struct st_sf_info *t, uint64_t offset_bytes,
			 void *buf, size_t len);

/* ---- sharded files: the layout transformers writes ---------------------------
 * A set of tensors is one file, STEM.safetensors, when its data fits in the
 * shard size; else shards STEM-0000K-of-0000N.safetensors and
 * STEM.safetensors.index.json ({"metadata": {"total_size": data bytes},
 * "weight_map": {tensor: shard}}, as transformers' save_pretrained() writes
 * it: json.dumps(indent=2, sort_keys=True) + newline). Tensors go to shards
 * in list order, as huggingface_hub's split_state_dict_into_shards() does:
 * a shard is closed when the next tensor would take its data past the shard
 * size; a tensor larger than the shard size alone gets a shard of its own
 * at the point it comes. Sizes count tensor data only (not headers). */

struct st_ckpt_trainer;

/* transformers' max_shard_size default, "5GB": 5 * 10^9 bytes. */
#define ST_CKPT_SHARD_BYTES_DEFAULT 5000000000ull
#define ST_CKPT_INDEX_SUFFIX ".safetensors.index.json"
/* The stems strata writes: P (model) and Adam's M and V (optimizer). */
#define ST_CKPT_MODEL_STEM "model"
#define ST_CKPT_OPTIM_STEM "optimizer"

/* One file of a layout. */
struct st_ckpt_shard {
	char name[64];           /* "model.safetensors", "model-00002-of-00004.safetensors" */
	size_t n_tensors;        /* its tensors: tensors[0..n_tensors), global */
	size_t *tensors;         /* indices into the list, in file order */
	uint64_t header_bytes;   /* 8 + padded JSON: where its data region starts */
	uint64_t bytes;          /* the whole file */
	uint64_t data_bytes;     /* its tensors' data */
};

/* Where each tensor of a list goes: which file, and at which byte of it. A
 * rank that writes part of a tensor pwrite()s at file offset[i] + k into a
 * file that st_ckpt_layout_create() made. */
struct st_ckpt_layout {
	char stem[32];
	size_t n_tensors, n_files;
	struct st_ckpt_shard *files;   /* [n_files] */
	size_t *file_of;               /* [n_tensors]: its file */
	uint64_t *offset;              /* [n_tensors]: first byte of its data in its file */
	uint64_t *size_bytes;          /* [n_tensors] */
	uint64_t total_bytes;          /* all tensors' data: the index's total_size */
	uint8_t **headers;             /* [n_files]: each file's first header_bytes */
	char index_name[64];           /* STEM.safetensors.index.json, "" for one file */
};

/* Lay tensors[0..n) (with meta in every file's header) out under stem
 * ("model") for a shard size of shard_bytes (0: ST_CKPT_SHARD_BYTES_DEFAULT).
 * One file, STEM.safetensors, when the data fits: then its bytes are exactly
 * st_ckpt_write_safetensors()'s. Checks as st_ckpt_write_safetensors() does.
 * Returns 0 (free l with st_ckpt_layout_fini()), -EINVAL, -ENOMEM. */
int st_ckpt_layout_init(struct st_ckpt_layout *l, const char *stem,
			const struct st_ckpt_tensor *tensors, size_t n,
			const struct st_sf_meta *meta, size_t n_meta,
			uint64_t shard_bytes);
void st_ckpt_layout_fini(struct st_ckpt_layout *l);

/* Write file f of l into dir, atomically, its data pulled through fill
 * (tensor_index: the list's, as planned; calls in the file's order), as
 * st_ckpt_write_safetensors() does. out_bytes, out_xxh64 as there. */
int st_ckpt_layout_write_file(const char *dir, const struct st_ckpt_layout *l,
			      const struct st_ckpt_tensor *tensors, size_t f,
			      st_ckpt_fill_fn fill, void *ctx,
			      uint64_t *out_bytes, uint64_t *out_xxh64);

/* For writers that fill a file by parts (a rank each): create dir/name of
 * file f with its header and its full size (holes where the data goes), not
 * fsynced (st_ckpt_dir_commit() fsyncs every file). Then pwrite() each
 * tensor's bytes at l->offset[i]; st_ckpt_trainer_add_hashed() lists it. */
int st_ckpt_layout_create(const char *dir, const struct st_ckpt_layout *l, size_t f);

/* The index's text (n_files > 1) into *out (malloc'd, *out_len bytes).
 * Returns 0 or -ENOMEM. */
int st_ckpt_layout_index_json(const struct st_ckpt_layout *l,
			      const struct st_ckpt_tensor *tensors, char **out,
			      size_t *out_len);

/* The index into dir (nothing when n_files is 1), atomically; listed in tr
 * (when not NULL) with its size and XXH64. For writers by parts, once the
 * shards are written. */
int st_ckpt_layout_write_index(const char *dir, const struct st_ckpt_layout *l,
			       const struct st_ckpt_tensor *tensors,
			       struct st_ckpt_trainer *tr);

/* Every file of the layout into dir: the shards, then the index (n_files >
 * 1), each written atomically and, when tr is not NULL, listed in it with
 * its size and XXH64. fill as for st_ckpt_layout_write_file(). */
int st_ckpt_layout_write(const char *dir, const struct st_ckpt_layout *l,
			 const struct st_ckpt_tensor *tensors, st_ckpt_fill_fn fill,
			 void *ctx, struct st_ckpt_trainer *tr);

/* A set of tensors as a directory holds it: dir/STEM.safetensors, or the
 * shards dir/STEM.safetensors.index.json names. Opening reads every header
 * and checks the index against them: weight_map an object of tensor name ->
 * plain file name; every file it names there; every tensor it maps in that
 * file and in no other file it names; every tensor of those files in it. A
 * refusal names the index, the key and the file, e.g.
 *   m/model.safetensors.index.json: weight_map["h.3.ln_1.weight"] names
 *   model-00003-of-00004.safetensors, which is missing */
struct st_ckpt_set;

/* Which form dir holds stem in: 1 one file, 2 shards (the index), 0
 * neither; -EINVAL (naming both) when it holds both. */
int st_ckpt_set_kind(const char *dir, const char *stem);

/* Open stem in dir (-ENOENT when neither form is there). */
int st_ckpt_set_open(struct st_ckpt_set **out, const char *dir, const char *stem);
void st_ckpt_set_close(struct st_ckpt_set *s);
/* A set of one file given by its path (any name). */
int st_ckpt_set_open_file(struct st_ckpt_set **out, const char *path);

/* Its files: the one file, or the shards the index names, by name; the
 * index's file name ("" for one file). */
size_t st_ckpt_set_files(const struct st_ckpt_set *s);
const struct st_ckpt_reader *st_ckpt_set_reader(const struct st_ckpt_set *s, size_t i);
const char *st_ckpt_set_file_name(const struct st_ckpt_set *s, size_t i);
const char *st_ckpt_set_index_name(const struct st_ckpt_set *s);
/* File i's size in bytes (as it was when the set was opened). */
uint64_t st_ckpt_set_file_bytes(const struct st_ckpt_set *s, size_t i);
/* Its tensors' data in bytes, summed; the path shown in messages (the
 * index, or the one file). */
uint64_t st_ckpt_set_data_bytes(const struct st_ckpt_set *s);
const char *st_ckpt_set_path(const struct st_ckpt_set *s);
/* Tensors in all files. */
size_t st_ckpt_set_count(const struct st_ckpt_set *s);

/* The tensor called name and the file that holds it, or NULL. */
const struct st_sf_info *st_ckpt_set_lookup(const struct st_ckpt_set *s, const char *name,
					    const struct st_ckpt_reader **r);

/* As st_ckpt_reader_find() over the set; *r gets the file that holds it. */
int st_ckpt_set_find(const struct st_ckpt_set *s, const char *name,
		     enum st_sf_dtype dtype, int ndim, const uint64_t *shape,
		     const struct st_sf_info **out, const struct st_ckpt_reader **r);

/* ---- trainer.json ------------------------------------------------------------ */

#define ST_CKPT_MAX_FILES 1024
#define ST_CKPT_NAME_BYTES 64
#define ST_CKPT_CURSOR_MAX_BYTES 256

/* One file of a checkpoint as trainer.json lists it. */
struct st_ckpt_file {
	char name[ST_CKPT_NAME_BYTES]; /* plain name inside the directory */
	uint64_t bytes;
	uint64_t xxh64;                /* XXH64, seed 0, of the whole file */
};

/* What trainer.json holds. Zero-initialise, fill, write; or read, use,
 * st_ckpt_trainer_fini(). */
struct st_ckpt_trainer {
	uint32_t version;           /* read: the file's; write: ignored */
	uint64_t step;              /* optimizer steps done */
	uint64_t seed;              /* the run's seed */
	size_t cursor_bytes;        /* 0 or the packed sampler state's size */
	uint8_t cursor[ST_CKPT_CURSOR_MAX_BYTES]; /* e.g. st_cursor_pack() */
	char *config_json;          /* owned: set with st_ckpt_trainer_set_config();
				     * NULL writes "config": {} */
	size_t n_files;
	struct st_ckpt_file files[ST_CKPT_MAX_FILES];
};

/* Free what tr owns (config_json) and zero it. */
void st_ckpt_trainer_fini(struct st_ckpt_trainer *tr);

/* Set the training config to a copy of json, the text of a JSON object
 * (e.g. json_object_to_json_string() of the caller's object); opaque to this
 * module. Returns 0, -EINVAL when it is not a JSON object, -ENOMEM. */
int st_ckpt_trainer_set_config(struct st_ckpt_trainer *tr, const char *json);

/* List a file with a known size and hash (e.g. from
 * st_ckpt_write_safetensors()). A name already listed is updated.
 * Returns 0, -EINVAL for a name that is empty, too long, contains '/', or
 * is "." / ".." / trainer.json; -ENOSPC when ST_CKPT_MAX_FILES are listed. */
int st_ckpt_trainer_add(struct st_ckpt_trainer *tr, const char *name,
			uint64_t bytes, uint64_t xxh64);

/* Hash dir/name (st_ckpt_file_hash()) and list it. Returns as
 * st_ckpt_trainer_add() or the hash's error. */
int st_ckpt_trainer_add_hashed(struct st_ckpt_trainer *tr, const char *dir,
			       const char *name);

/* The listed file called name, or NULL. Borrowed from tr. */
const struct st_ckpt_file *st_ckpt_trainer_find(const struct st_ckpt_trainer *tr,
						const char *name);

/* Write tr as JSON to path, atomically (temporary, fsync, rename). Returns 0,
 * -EINVAL for a bad tr (config not an object, cursor too long), -errno. */
int st_ckpt_trainer_write(const char *path, const struct st_ckpt_trainer *tr);

/* Read path into tr (zeroed first; st_ckpt_trainer_fini() it after success;
 * on failure tr owns nothing). Returns 0, -EINVAL for a malformed file or a
 * version newer than ST_CKPT_VERSION (the detail names the field), -errno. */
int st_ckpt_trainer_read(const char *path, struct st_ckpt_trainer *tr);

/* Check that every file tr lists exists in dir with its size and XXH64
 * (sizes first, for every file, then checksums by streaming reads). Returns
 * 0; -ENOENT for a missing file; -EINVAL for a size or checksum mismatch,
 * e.g. "ckpt/step-000100/optimizer.safetensors: checksum mismatch (file
 * changed or truncated)"; -errno from reading. */
int st_ckpt_verify(const char *dir, const struct st_ckpt_trainer *tr);

/* What tr says, against itself and dir, without reading the files: it
 * lists model and optimizer (one file or an index) and config.json; every
 * regular file in dir but trainer.json is listed (a dropped entry would
 * hide damage to its file); and when its config has "grad_accum" (strata
 * train's), the sampler cursor has drawn step * grad_accum batches.
 * Returns 0 or -EINVAL naming what is wrong, -errno listing dir. */
int st_ckpt_check(const char *dir, const struct st_ckpt_trainer *tr);

/* ---- checkpoint directories -------------------------------------------------- */

/* A checkpoint being written. Fields are read-only for the caller. */
struct st_ckpt_dir {
	char *root;   /* DIR */
	char *final;  /* DIR/step-000123 */
	char *tmp;    /* DIR/step-000123.tmp.<pid>: write the files here */
	uint64_t step;
};

/* Start checkpoint step under root: create root (and missing parents),
 * remove leftovers of crashed writers in root (step-*.tmp.<pid> and
 * latest.tmp.<pid> whose process is gone, or ours; nothing else in root is
 * touched), and create d->tmp, empty. One writer per root at a time
 * (st_ckpt_lock() holds root for it).
 * Returns 0 or -errno; on failure d owns nothing. */
int st_ckpt_dir_begin(struct st_ckpt_dir *d, const char *root, uint64_t step);

/* Publish the files written in d->tmp: fsync each of them and the
 * directory, rename it to d->final (when d->final exists, e.g. the same step
 * saved again, swap them with renameat2(RENAME_EXCHANGE) and remove the old
 * one), fsync root, point root/latest at it (symlink to a temporary name,
 * rename, fsync root), then, when keep > 0, remove all but the newest keep
 * step directories with a step <= d->step (a directory of a larger step,
 * from another run, is left alone; the one just written is always kept).
 * d is finished either way. Returns 0 or -errno; a failure before the rename
 * removes d->tmp and leaves everything as it was; one after it (the latest
 * link, pruning) is still returned though the checkpoint is in place. */
int st_ckpt_dir_commit(struct st_ckpt_dir *d, unsigned keep);

/* Hold root for this process, the one writer it may have: create root (and
 * missing parents) when it is missing, then take an exclusive flock(2) on
 * the directory itself, held until st_ckpt_unlock() or the process ends (the
 * kernel drops it however the process dies, SIGKILL too, so a crashed run
 * never leaves root locked). *made: the topmost directory this call created
 * (malloc'd; NULL when root was there), for a caller that gives up before
 * using root and removes what it made. Returns 0 with *fd >= 0; 0 with
 * *fd = -1 after a warning where the file system has no flock (nothing is
 * enforced there); -EBUSY when another process holds root ("DIR: another
 * process is saving checkpoints here ..."); -errno. */
int st_ckpt_lock(const char *root, int *fd, char **made);

/* Release a lock st_ckpt_lock() took (fd < 0: nothing). */
void st_ckpt_unlock(int fd);

/* A step-N directory of a --save root: N, and its name ("step-000123"). */
struct st_ckpt_step {
	int64_t step;
	char *name;
};

/* root's step-N directories (N all digits; temporaries and other names are
 * left out), newest (largest N) first: *out is malloc'd, NULL when *n is 0;
 * give it back with st_ckpt_list_free(). Returns 0 or -errno ("root: ..."). */
int st_ckpt_list(const char *root, struct st_ckpt_step **out, size_t *n);
void st_ckpt_list_free(struct st_ckpt_step *s, size_t n);

/* Reading a --save root while a run saves into it: the run may prune a
 * step directory (--keep: renamed to *.tmp.<pid>, then removed) or replace
 * it (the same step saved again: RENAME_EXCHANGE) while it is read, so a
 * file of it goes missing mid-read. A stamp taken before the reading tells
 * such a checkpoint from a damaged one afterwards: a damaged one is still
 * the directory stamped. The identity is the directory's device and inode. */
struct st_ckpt_stamp {
	uint64_t dev, ino;
};

enum st_ckpt_fate {
	ST_CKPT_THERE,    /* dir is still the directory stamped */
	ST_CKPT_PRUNED,   /* nothing is at dir any more */
	ST_CKPT_REPLACED, /* another directory is at dir now */
};

/* Stamp the directory dir. Returns 0; -ENOENT when it is not there (pruned
 * before the reading began); -ENOTDIR; -errno. */
int st_ckpt_stamp(const char *dir, struct st_ckpt_stamp *s);

/* What became of the directory stamped as s at dir since. An error other
 * than "not there" (EACCES...) counts as ST_CKPT_THERE: the reading's own
 * error is the one to report then. */
enum st_ckpt_fate st_ckpt_fate(const char *dir, const struct st_ckpt_stamp *s);

/* Remove d->tmp and what is in it, and finish d. Safe on a finished or
 * zeroed d. */
void st_ckpt_dir_abort(struct st_ckpt_dir *d);

/* The checkpoint directory --resume path means: path itself when it holds
 * trainer.json; else the target of path/latest (unless that directory is
 * missing: then a warning, and on); else the step-N directory of path with
 * the largest N. *out is malloc'd (free() it). Returns 0,
 * -ENOENT when there is no checkpoint there (the detail says so), -errno. */
int st_ckpt_resolve(const char *path, char **out);

#endif
