//! Whole models next to candle-transformers (`examples/candle_transformers.rs` runs these on the
//! whole-model bundles of `weights/whole/`): the U-Net (`unet`) and the VAE (`vae`). Each row of the printed table is a `unet_parity::port::PortCheck` run: max |· − PyTorch's
//! f32 output| and max |· − PyTorch's float64 output|.

pub mod unet;
pub mod vae;

use anyhow::Result;
use candle_core::{DType, Tensor};
use std::path::Path;
use unet_parity::port::PortReport;

/// One row: model, who, dtype, then (vs PyTorch f32, vs float64, PyTorch's own vs float64) or
/// the error that stopped the run.
pub type Row = (String, String, DType, std::result::Result<(f64, f64, f64), String>);

pub type Table = Vec<Row>;

/// An error's first line.
pub fn first_line(e: &dyn std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// max |a − b| in f64.
pub fn max_abs(a: &Tensor, b: &Tensor) -> Result<f64> {
    let d = (a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?;
    Ok(d.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?)
}

/// A table row from a check's report (its first output) or the error that stopped it.
pub fn row(model: &str, who: &str, dtype: DType, report: Result<PortReport>) -> Row {
    // A failed forward reads "<bundle>: your port: <error>": the error alone.
    let short = |e: anyhow::Error| {
        let line = first_line(&e);
        line.rsplit_once("your port: ")
            .map_or(line.clone(), |(_, e)| e.to_string())
    };
    let numbers = report.map_err(short).and_then(|r| {
        let o = r.outputs.first().ok_or("no output")?;
        Ok((
            o.max_abs,
            o.ours_vs_f64.unwrap_or(f64::NAN),
            o.torch_vs_f64.unwrap_or(f64::NAN),
        ))
    });
    (model.to_string(), who.to_string(), dtype, numbers)
}

/// Print the stages of candle-transformers' public blocks assembled as its whole model `whole`
/// (`report`), once `same` (max |assembled − whole| on the bundle's inputs) shows the assembly is
/// that model bit for bit.
pub fn print_assembled(report: &PortReport, same: Option<f64>, whole: &str) -> Result<()> {
    use anyhow::Context;
    let same = same.context("the forward did not run")?;
    if same != 0.0 {
        anyhow::bail!("candle-transformers' blocks assembled differ from its {whole} by {same:.2e}");
    }
    println!("  candle-transformers' blocks, assembled as its {whole} (the same output, bit for bit):");
    for s in report.trace.stages.iter().filter(|s| s.compare.is_some()) {
        let c = s.compare.as_ref().context("compare")?;
        println!("    {:<24} max abs {:>9.2e}  {}", s.stage, c.max_abs, s.status);
    }
    Ok(())
}

/// Run every whole-model bundle, then print the table (Markdown, as docs/candle-transformers.md
/// records it). `detail`: also where candle-transformers' error arises (its public blocks
/// assembled, each part on PyTorch's own input).
pub fn run(paths: &[&Path], detail: bool) -> Result<()> {
    let mut table = Table::new();
    for path in paths {
        let block = unet_parity::bundle::Bundle::read(path)?.block;
        if block == unet_attention::models::AutoencoderKL::BLOCK {
            vae::compare(path, &mut table, detail)?;
        } else {
            unet::compare(path, &mut table, detail)?;
        }
        println!();
    }
    println!("| model | run | dtype | max abs error vs PyTorch f32 | vs float64 |");
    println!("|---|---|---|---:|---:|");
    let mut own = std::collections::BTreeSet::new();
    for (model, who, dtype, numbers) in &table {
        if let Ok((_, _, torch)) = numbers {
            if own.insert(model.clone()) {
                println!("| {model} | PyTorch's own f32 | F32 | — | {torch:.2e} |");
            }
        }
        match numbers {
            Ok((f32_err, f64_err, _)) => println!("| {model} | {who} | {dtype:?} | {f32_err:.2e} | {f64_err:.2e} |"),
            Err(e) => println!("| {model} | {who} | {dtype:?} | fails: `{e}` | |"),
        }
    }
    Ok(())
}
