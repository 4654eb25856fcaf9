//! The heap trim against glibc's real allocator, in a test binary of its own: it reads the process's
//! resident memory, which tests running beside it in one process would move.

use pko_actors::runtime::heap_trim::{count_heap, resident_bytes, trim_heap, TrimRule};

/// Memory freed between chunks still in use stays resident (the heap's top cannot shrink past them)
/// until a trim hands it back.
#[test]
fn freed_memory_between_live_chunks_is_handed_back() {
    // 64 MiB in 64 KiB blocks (below the allocator's mmap threshold), written so every page is
    // resident; every other block is kept, so the freed half lies between live chunks.
    let mut blocks: Vec<Vec<u8>> = (0..1024)
        .map(|i| vec![(i % 255 + 1) as u8; 64 << 10])
        .collect();
    let kept: Vec<Vec<u8>> = blocks.drain(..).step_by(2).collect();
    let count = count_heap().expect("glibc counts its heap");
    assert!(count.free >= 30 << 20, "{count:?}");
    assert!(TrimRule::default().worth_trimming(count));

    let resident = resident_bytes().expect("resident memory readable");
    let trim = trim_heap();
    assert!(
        trim.released >= 24 << 20,
        "{trim:?}, resident before {resident}"
    );
    // What was kept is intact.
    assert!(kept
        .iter()
        .enumerate()
        .all(|(i, block)| block.iter().all(|&b| b == ((2 * i) % 255 + 1) as u8)));
}
