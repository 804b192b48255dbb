//! The binary's global allocator (feature `mimalloc`): mimalloc, with every
//! request of an alignment of eight bytes or less served by its plain entry
//! points. This module owns the only `unsafe` code of the binary (the
//! library forbids it); the examples and benchmarks include this file, so
//! that their figures are the binary's.
//!
//! Why not `mimalloc::MiMalloc` as it is: it sends every request through
//! `mi_malloc_aligned`. mimalloc v3 serves that from the plain size class
//! only when a free block of that class happens to be at hand and aligned.
//! When the class's free list is empty and the size is not a power of two,
//! it over-allocates in a larger class (size + alignment - 1) instead. It
//! never collects the blocks freed into the smaller class, so once a class
//! runs dry it stays on that path (in the dense MiB of the benchmarks,
//! 34,049 of 292,126 allocations). This is an open issue of the crate
//! (purpleprotocol/mimalloc_rust#170); no released crate does the dispatch
//! below, so it is written here.
//!
//! Why the dispatch is sound: mimalloc's size classes are all multiples of
//! eight bytes and a page's first block is at least sixteen-aligned, so
//! every block `mi_malloc` returns is eight-aligned. Larger alignments keep
//! the aligned entry points.
//!
//! Measured with `examples/throughput` (callgrind, no LTO), against
//! `MiMalloc`: dense 1 MiB 195.7M -> 188.4M instructions (-3.7%), the
//! corpora whole 6.33M -> 6.17M (-2.4%), at 4-byte chunks -1.3%.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The largest alignment every mimalloc block has.
const PLAIN_ALIGN: usize = 8;

/// mimalloc as the global allocator; see the module doc.
pub struct Allocator;

// SAFETY: every pointer comes from mimalloc and goes back to it. A request
// aligned to PLAIN_ALIGN or less takes mi_malloc / mi_zalloc / mi_realloc,
// whose blocks are all PLAIN_ALIGN-aligned (the module doc says why); any
// other takes the aligned entry point with the layout's alignment. mi_free
// and mi_realloc accept blocks from either family.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocating entry points, as `new_block` says.
        unsafe { new_block(layout, libmimalloc_sys::mi_malloc, libmimalloc_sys::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`, zeroed.
        unsafe { new_block(layout, libmimalloc_sys::mi_zalloc, libmimalloc_sys::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: the caller passes a pointer this allocator returned.
        unsafe { libmimalloc_sys::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller passes a pointer this allocator returned with
        // `layout`; the new block keeps that alignment, as in `alloc`.
        unsafe {
            if layout.align() <= PLAIN_ALIGN {
                libmimalloc_sys::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                libmimalloc_sys::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// A new block for `layout`: from `plain` when the layout's alignment is
/// one every block has, else from `aligned` with the alignment.
///
/// # Safety
///
/// `plain` and `aligned` are a pair of mimalloc's allocating entry points
/// (`mi_malloc` and `mi_malloc_aligned`, or the zeroing pair).
#[inline(always)]
unsafe fn new_block(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: a size and a power-of-two alignment, as both take.
    unsafe {
        if layout.align() <= PLAIN_ALIGN { plain(layout.size()) } else { aligned(layout.size(), layout.align()) }.cast()
    }
}

#[cfg(test)]
mod tests {
    /// Every alignment on both paths, sizes around mimalloc's classes and
    /// past its small objects, many blocks of a size alive at once (so a
    /// class runs dry and takes a fresh page): aligned, writable, and
    /// carried over by `realloc` up and down.
    #[test]
    fn blocks_are_aligned_and_kept_through_realloc() {
        // Imported here: a bench without the test harness that includes
        // this file drops the test, and an import outside it would be unused.
        use super::{Allocator, GlobalAlloc, Layout};
        let sizes = (1..=130).chain([255, 256, 257, 1000, 4096, 5000, 70_000, 1 << 20]);
        for align in [1usize, 2, 4, 8, 16, 32, 64, 4096] {
            for size in sizes.clone() {
                let Ok(layout) = Layout::from_size_align(size, align) else { continue };
                let mut live = Vec::new();
                for round in 0..40u8 {
                    // SAFETY: a non-zero size; the block is written within
                    // its size and freed once, below.
                    unsafe {
                        let p = if round % 2 == 0 { Allocator.alloc(layout) } else { Allocator.alloc_zeroed(layout) };
                        assert!(!p.is_null(), "{size}/{align}");
                        assert_eq!(p as usize % align, 0, "{size}/{align}");
                        if round % 2 == 1 {
                            assert!(
                                std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0),
                                "zeroed {size}/{align}"
                            );
                        }
                        std::ptr::write_bytes(p, round, size);
                        live.push((p, round));
                    }
                }
                for (i, (p, round)) in live.into_iter().enumerate() {
                    let new_size = if i % 2 == 0 { size * 2 + 8 } else { size.div_ceil(2) };
                    let Ok(new_layout) = Layout::from_size_align(new_size, align) else { continue };
                    // SAFETY: `p` came from `Allocator` with `layout`; the
                    // block it gives back is read within both sizes and
                    // freed with its new layout.
                    unsafe {
                        let q = Allocator.realloc(p, layout, new_size);
                        assert!(!q.is_null(), "{size}/{align} -> {new_size}");
                        assert_eq!(q as usize % align, 0, "{size}/{align} -> {new_size}");
                        let kept = size.min(new_size);
                        assert!(
                            std::slice::from_raw_parts(q, kept).iter().all(|&b| b == round),
                            "{size}/{align} -> {new_size}"
                        );
                        Allocator.dealloc(q, new_layout);
                    }
                }
            }
        }
    }
}
