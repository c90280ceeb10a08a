//! Arbitrary bytes as a pickle, straight into the tool's own reader (`crates/parity/src/pickle/mod.rs`),
//! without the zip archive around it that the `checkpoint` target builds: every opcode, limit
//! and the flattening walk, as fast as libFuzzer can feed them. Errors are expected; a panic, an
//! abort, a stack overflow or a runaway allocation is a bug. A read that succeeds must keep
//! its own promises: tensor records whose elements and offset fit their storage.
/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let Ok(contents) = unet_parity::pickle::read(data) else {
        return;
    };
    for (name, record) in &contents.tensors {
        assert!(
            !name.is_empty() || contents.tensors.len() == 1,
            "an empty name among several"
        );
        let Ok(r) = record else { continue };
        assert_eq!(r.shape.len(), r.stride.len(), "{name}: shape and stride ranks");
        let elements = r.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        assert!(elements.is_some(), "{name}: the element count overflows");
    }
}
