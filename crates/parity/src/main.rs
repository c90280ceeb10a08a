//! `unet-parity`: see `unet-parity --help`.
fn main() {
    if stdout_was_closed() {
        eprintln!("error: cannot write the output: standard output is closed");
        std::process::exit(2);
    }
    let code = unet_parity::cli::run_main(std::env::args_os(), &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(code);
}

/// Whether the tool was started with its standard output closed (`>&-`). Rust's runtime reopens
/// a closed standard descriptor on `/dev/null`, read-write, before `main`, so the table would go
/// nowhere with exit 0. A shell's `> /dev/null` opens it write-only, which is a choice, not a
/// closed output. Linux only (read from /proc); elsewhere false.
fn stdout_was_closed() -> bool {
    let Ok(target) = std::fs::read_link("/proc/self/fd/1") else {
        return false;
    };
    if target != std::path::Path::new("/dev/null") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/fdinfo/1") else {
        return false;
    };
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
    // O_ACCMODE = 3, O_RDWR = 2.
    flags.is_some_and(|f| f & 3 == 2)
}
