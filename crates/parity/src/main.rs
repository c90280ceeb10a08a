//! `unet-parity`: see `unet-parity --help`.
fn main() {
    let code = unet_parity::cli::run(std::env::args_os(), &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(code);
}
