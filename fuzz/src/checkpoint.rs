//! Arbitrary bytes as the `data.pkl` of a `torch.save` zip archive (and, from the last byte, as a
//! whole file): the checkpoint reader (the pickle reader's opcodes and limits, the flattening walk, sections,
//! lazy tensor reads) and `detect`. Errors are expected; a panic, an abort or a stack overflow is
//! a bug.
use std::io::Write;
use unet_parity::checkpoint::Checkpoint;

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let path = std::env::temp_dir().join(format!("unet-parity-fuzz-{}.pt", std::process::id()));
    let raw = data.last().is_some_and(|b| b & 1 == 1);
    let bytes = if raw {
        data.to_vec()
    } else {
        let mut buf = std::io::Cursor::new(Vec::new());
        {
            let mut zip = zip::ZipWriter::new(&mut buf);
            let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
            if zip.start_file("archive/data.pkl", opts).is_err() || zip.write_all(data).is_err() {
                return;
            }
            // One float storage the pickle may point at.
            if zip.start_file("archive/data/0", opts).is_err() || zip.write_all(&[0u8; 64]).is_err() {
                return;
            }
            if zip.finish().is_err() {
                return;
            }
        }
        buf.into_inner()
    };
    if std::fs::write(&path, bytes).is_ok() {
        read(&path);
    }
    let _ = std::fs::remove_file(&path);
}

/// The file at `path` through the checkpoint reader: a panic inside it is the bug looked for.
fn read(path: &std::path::Path) {
    let opened = unet_parity::guard::catch(path, || Checkpoint::open(path));
    if let Err(unet_parity::ParityError::Internal { message, .. }) = &opened {
        panic!("panic in the checkpoint reader: {message}");
    }
    if let Ok(ck) = opened {
        let names: Vec<String> = ck.names().cloned().collect();
        for n in &names {
            let _ = ck.load(n);
        }
        let _ = unet_parity::detect::detect(&ck, None);
        let _ = ck.resolve_prefix("model.");
    }
}
