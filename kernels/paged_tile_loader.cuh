/* paged_tile_loader.cuh - the paged K/V tile loader's addressing of paged_attention.cu's
   pitched stages (paged_prefill_sm90.cu writes the same arithmetic out: see there why).

   A CTA walks tiles of TILE keys aligned to multiples of TILE, from floor(key0 / TILE) *
   TILE to key1 (attn_paged_tiles). For every key row of the STAGES tiles in flight the
   byte offset of its K row in the cache sits in shared memory (the row table, sBlk
   [stage][key]; -1 for a key outside [key0, key1): the stage row is zero-filled and
   nothing is read, not even the key's block_table entry), so a copy's address is one
   64-bit add. The table of tile it + STAGES is read from block_table into registers
   while tile it computes (prefetch) and stored once the stage is free (store), so the
   block-table latency hides under compute.

   Cache layout (attn__paged_params, the CPU's): block b is [K half][V half]; a half is
   BLOCK_SIZE x num_kv_heads rows of ROW_BYTES, then (SCALE_BYTES 4: per-token-head 8-bit
   caches) one f32 scale per row. The V row of a key is v_bytes after its K row. */
#ifndef ATTN_PAGED_TILE_LOADER_CUH
#define ATTN_PAGED_TILE_LOADER_CUH

#include "attn_common.cuh"
#include "attn_params.cuh" /* attn__paged_params */

/* The first tile and the number of tiles that cover [key0, key1) (0 when it is empty). */
template <int TILE>
ATTN_DEV void attn_paged_tiles(int key0, int key1, int &tile0, int &ntiles) {
    tile0 = key1 > key0 ? key0 / TILE * TILE : 0;
    ntiles = key1 > key0 ? (key1 - tile0 + TILE - 1) / TILE : 0;
}

/* Where a request's keys live, for one KV head. */
template <int BLOCK_SIZE_, int ROW_BYTES, int SCALE_BYTES>
struct attn_paged_rows {
    const int *bt;     /* the request's block_table row */
    attn_i64 v_bytes;  /* K row -> V row: one block half */
    int key0, key1, kv_head, num_kv_heads;

    ATTN_DEV attn_paged_rows(const attn__paged_params &p, int req, int head, int k0, int k1)
        : bt(p.block_table + (attn_i64)req * p.block_table_stride),
          v_bytes((attn_i64)BLOCK_SIZE_ * p.num_kv_heads * (ROW_BYTES + SCALE_BYTES)), key0(k0), key1(k1),
          kv_head(head), num_kv_heads(p.num_kv_heads) {}

    /* physical block of key j (absolute), -1 outside [key0, key1) */
    ATTN_DEV int block_of(int j) const { return j >= key0 && j < key1 ? bt[(unsigned)j / BLOCK_SIZE_] : -1; }

    /* byte offset in the cache of key j's K row, given its block b; -1 for b = -1 */
    ATTN_DEV attn_i64 row_offset(int b, int j) const {
        return b >= 0 ? (attn_i64)b * (2 * v_bytes) +
                            ((attn_i64)((unsigned)j % BLOCK_SIZE_) * num_kv_heads + kv_head) * ROW_BYTES
                      : (attn_i64)-1;
    }

    /* SCALE_BYTES 4: the K scale of key j's row sits this many bytes after its codes (the V
       scale as far after the V codes): the codes plane, then row x's scale, x = row in
       block * heads + head */
    ATTN_DEV int scale_delta(int j) const {
        const int x = (int)((unsigned)j % BLOCK_SIZE_) * num_kv_heads + kv_head;
        return BLOCK_SIZE_ * num_kv_heads * ROW_BYTES - x * (ROW_BYTES - 4);
    }

    /* The row table of the first STAGES tiles from tile0 (sDel: SCALE_BYTES 4, each row's
       scale_delta). The caller syncs before the copies read it. */
    template <int STAGES, int TILE, int THREADS>
    ATTN_DEV void fill(attn_i64 *sBlk, int *sDel, int tile0, int tid) const {
#pragma unroll
        for (int s = 0; s < STAGES; s++)
            for (int r = tid; r < TILE; r += THREADS) {
                const int j = tile0 + s * TILE + r;
                sBlk[s * TILE + r] = row_offset(block_of(j), j);
                if (SCALE_BYTES) sDel[s * TILE + r] = scale_delta(j);
            }
    }

    /* The block numbers of tile `tile` (its first key) this thread stores: into registers
       before the tile in its stage computes ... */
    template <int TILE, int THREADS, int BPT>
    ATTN_DEV void prefetch(int tile, int tid, int (&next)[BPT]) const {
#pragma unroll
        for (int i = 0; i < BPT; i++) next[i] = tid + i * THREADS < TILE ? block_of(tile + tid + i * THREADS) : -1;
    }
    /* ... and into the row table of `stage` after it. */
    template <int TILE, int THREADS, int BPT>
    ATTN_DEV void store(attn_i64 *sBlk, int *sDel, int stage, int tile, int tid, const int (&next)[BPT]) const {
#pragma unroll
        for (int i = 0; i < BPT; i++)
            if (tid + i * THREADS < TILE) {
                const int j = tile + tid + i * THREADS;
                sBlk[stage * TILE + tid + i * THREADS] = row_offset(next[i], j);
                if (SCALE_BYTES) sDel[stage * TILE + tid + i * THREADS] = scale_delta(j);
            }
    }
};

#endif /* ATTN_PAGED_TILE_LOADER_CUH */
