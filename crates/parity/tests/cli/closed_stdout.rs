//! The real binary with its standard output closed (`>&-`) says so and exits 2 (issue 32: it
//! exited 0 and the table was lost); `> /dev/null` stays a normal run.
#![cfg(target_os = "linux")]

use std::process::Command;

fn run(redirect: &str) -> (Option<i32>, String) {
    let bundle = crate::common::weights().join("textbook/self_attention_dx6_d5_dv7.safetensors");
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec \"$0\" check \"$1\" {redirect}"))
        .arg(env!("CARGO_BIN_EXE_unet-parity"))
        .arg(bundle)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_closed_stdout_is_exit_2() {
    let (code, err) = run(">&-");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("standard output is closed"), "{err}");
    let (code, err) = run("> /dev/null");
    assert_eq!(code, Some(0), "{err}");
}
