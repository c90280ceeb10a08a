//! What the GPU checks the kit runs (`fused_check`, `layers_check`, `conv_check`) share: the
//! `--out FILE` (else stdout) and `--quick` arguments, the CUDA device, one JSON line per case
//! counted as passed or failed, the closing summary line and the exit code (0: every case
//! passed, 1: some failed, 2: the output file cannot be written, 3: no CUDA device). Included by
//! each of them with `#[path]`; not an example of its own.

use serde_json::Value;
use std::io::Write;

/// The JSON lines of one check and their tally.
pub struct Report {
    name: &'static str,
    out: Box<dyn Write>,
    /// `--quick`: fewer cases.
    pub quick: bool,
    passed: usize,
    failed: usize,
}

impl Report {
    /// From the command line; `Err(2)` (after one line on stderr) when `--out` cannot be created.
    pub fn from_args(name: &'static str) -> Result<Report, i32> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let out: Box<dyn Write> = match args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)) {
            Some(p) => match std::fs::File::create(p) {
                Ok(f) => Box::new(f),
                Err(e) => {
                    eprintln!("{name}: cannot create {p}: {e}");
                    return Err(2);
                }
            },
            None => Box::new(std::io::stdout()),
        };
        Ok(Report {
            name,
            out,
            quick,
            passed: 0,
            failed: 0,
        })
    }

    /// CUDA device 0; `Err(3)` (after one line) where there is none.
    pub fn cuda_device(&self) -> Result<candle_core::Device, i32> {
        candle_core::Device::new_cuda(0).map_err(|e| {
            eprintln!("{}: no CUDA device: {e}", self.name);
            3
        })
    }

    /// `Err(2)` (after one line) unless the CUDA layers are on (`UNET_ATTENTION_CUDA_LAYERS=on`):
    /// the layers a check tests run only then (off by default until they have passed here).
    #[allow(dead_code)] // fused_check tests the attention kernel, which this switch leaves alone
    pub fn require_cuda_layers(&self) -> Result<(), i32> {
        match unet_attention::cuda::layers_enabled() {
            Ok(true) => Ok(()),
            Ok(false) => {
                eprintln!(
                    "{}: the CUDA layers are off: run with UNET_ATTENTION_CUDA_LAYERS=on (run.sh does)",
                    self.name
                );
                Err(2)
            }
            Err(e) => {
                eprintln!("{}: {e}", self.name);
                Err(2)
            }
        }
    }

    /// `line` (a JSON object describing the case) with the fields of `result` added, or with
    /// `"pass": false` and the error.
    pub fn merged(mut line: Value, result: candle_core::Result<Value>) -> Value {
        match result {
            Ok(Value::Object(fields)) => {
                if let Some(obj) = line.as_object_mut() {
                    obj.extend(fields);
                }
            }
            Ok(other) => {
                line["pass"] = false.into();
                line["error"] = format!("a case gave {other}, not a JSON object").into();
            }
            Err(e) => {
                line["pass"] = false.into();
                line["error"] = e.to_string().into();
            }
        }
        line
    }

    /// Write `line` and count it by its `"pass"` field (a failure is also printed on stderr).
    pub fn record(&mut self, line: Value) {
        if line["pass"] == true {
            self.passed += 1;
        } else {
            self.failed += 1;
            eprintln!("{}: FAILED {line}", self.name);
        }
        let _ = writeln!(self.out, "{line}");
    }

    /// The summary line (`{"stage": stage, "summary": true, "passed", "failed"}`) and the exit
    /// code: 0 when every case passed, else 1.
    pub fn finish(mut self, stage: &str) -> i32 {
        eprintln!("{}: {} passed, {} failed", self.name, self.passed, self.failed);
        let summary =
            serde_json::json!({"stage": stage, "summary": true, "passed": self.passed, "failed": self.failed});
        let _ = writeln!(self.out, "{summary}");
        let _ = self.out.flush();
        i32::from(self.failed > 0)
    }
}

/// The median wall time of 5 calls of `f` after one warm-up, in milliseconds, the device's queue
/// drained after each.
pub fn median_ms(
    dev: &candle_core::Device,
    mut f: impl FnMut() -> candle_core::Result<candle_core::Tensor>,
) -> candle_core::Result<f64> {
    f()?;
    dev.synchronize()?;
    let mut ms = vec![];
    for _ in 0..5 {
        let t = std::time::Instant::now();
        f()?;
        dev.synchronize()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

/// What the first call of a kernel family costs, loading its image included (`cuModuleLoadData`:
/// the SASS of the GPU's architecture in milliseconds, or the driver's ptxas over PTX for
/// minutes), as one JSON line of `stage`: `first_call_s` (`f` and a synchronisation, timed once,
/// before any other call of the family in this process), `image` (what the GPU runs of it, from
/// `describe`), `ran` (whether `f` gave a result rather than declining) and `pass`: it ran within
/// `target_s` = 2 s.
#[allow(dead_code)] // conv_check's convolutions are cuDNN's, no image of this crate
pub fn first_call(
    stage: &str,
    dev: &candle_core::Device,
    image: candle_core::Result<String>,
    f: impl FnOnce() -> candle_core::Result<Option<candle_core::Tensor>>,
) -> Value {
    const TARGET_S: f64 = 2.0;
    let image = image.unwrap_or_else(|e| format!("unknown: {e}"));
    let start = std::time::Instant::now();
    let ran = f().and_then(|out| dev.synchronize().map(|()| out.is_some()));
    let secs = start.elapsed().as_secs_f64();
    let (ran, error) = match ran {
        Ok(r) => (r, None),
        Err(e) => (false, Some(e.to_string())),
    };
    serde_json::json!({
        "stage": stage, "case": "first_call", "first_call_s": secs, "target_s": TARGET_S,
        "image": image, "ran": ran, "error": error, "pass": ran && secs < TARGET_S,
    })
}
