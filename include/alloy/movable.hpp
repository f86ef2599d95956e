// SPDX-License-Identifier: Apache-2.0
// alloy/movable.hpp: movable memory (docs/design.md#movable-memory): handles, their table, the copy
// engine that moves and spills them, the counters of the movable policies, and the RAII
// `movable_buffer<A>`.
//
// Raw pointers never move. Memory that may be spilled to host or compacted is asked for as a
// handle, after `GlobalAlloc(GMEM_MOVEABLE)` / `GlobalLock`:
//
//   alloy::handle h = alloc.allocate_movable(bytes);  // resident, unlocked ("inactive")
//   void* p = alloc.lock(h);        // resident on the device and pinned in place ("active")
//   ...                             // p is valid until the matching unlock
//   alloc.unlock(h);                // may now be moved or spilled; p is no longer valid
//   alloc.deallocate(h);
//
// The handle calls are the throwing edge for handles, and every movable policy
// (`host_spill_reclaimer`, `compacting_defragmenter`) follows the same rules:
//
// - `allocate_movable(bytes)` is noexcept and returns an empty handle when the memory cannot be
//   found (out of memory is a normal event). Zero bytes is a valid request (a unique minimal
//   block, `size_of(h) == 0`). Movable blocks are aligned to `movable_alignment` (256 B).
// - `lock(h)` nests (a lock count, like `GlobalLock`): every `lock` needs one `unlock`. It returns
//   the block's address, fixed until the last `unlock`. When the block is spilled and cannot be
//   brought back (out of memory, or a failed copy) it returns nullptr and the block stays as it
//   was, spilled and intact; `lock` may then be tried again.
// - Bad input throws `alloy::logic_error` and changes nothing: a handle that is empty, unknown,
//   already deallocated (handles carry a generation, so a stale handle is recognised even when
//   its slot was reused) or another allocator's (handles carry their table's key), `unlock` of a
//   handle that is not locked, `deallocate` of a locked handle. `try_deallocate(handle)` noexcept
//   frees as `deallocate` does and refuses the handles it would throw for with false, so that a
//   `stats<>` above counts only the frees the policy took.
// - Content is preserved bit for bit through every move and spill.
#pragma once
#pragma once

#include <alloy/movable/buffer.hpp>
#include <alloy/movable/copy_engine.hpp>
#include <alloy/movable/counters.hpp>
#include <alloy/movable/handle_table.hpp>
