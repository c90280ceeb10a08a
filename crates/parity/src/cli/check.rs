//! `check`: run every bundle's block, print the table (or one JSON document) and the notes, and
//! exit with [`EXIT_PASS`], [`EXIT_MISMATCH`] or [`EXIT_UNUSABLE`].

use super::args::CheckArgs;
use super::print::{line, print_table, print_trace};
use super::{open_device, resolve_model, EXIT_INCONCLUSIVE, EXIT_MISMATCH, EXIT_PASS, EXIT_UNUSABLE};
use crate::bundle::{parse_dtype, Load};
use crate::check::{check_file, Options, Report};
use crate::compare::Outcome;
use crate::error::ParityError;
use crate::guard;
use crate::weights::conversion_note;
use std::io::Write;
use std::path::PathBuf;

/// Each bundle's file and its report, or why it could not be checked.
type Results = Vec<(PathBuf, Result<Report, ParityError>)>;

/// Run `check`; returns the exit code.
pub(super) fn run(args: CheckArgs, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let opts = match options(&args) {
        Ok(opts) => opts,
        Err(message) => {
            let _ = writeln!(err, "error: {message}");
            return EXIT_UNUSABLE;
        }
    };
    let Some(files) = bundles(&args.paths, err) else {
        return EXIT_UNUSABLE;
    };
    let results = check_all(&files, &opts, &args);
    let counts = Counts::of(&results);
    if args.json {
        print_json(&results, &counts, out);
    } else {
        print_results(&results, &counts, out, err);
    }
    counts.exit_code()
}

/// The check options from the flags: the device opened, the model's weights and config resolved.
fn options(args: &CheckArgs) -> Result<Options, String> {
    let device = open_device(args.device)?;
    let (weights, config) = resolve_model(
        args.weights.clone(),
        args.prefix.clone(),
        args.config.clone(),
        &args.hub,
    )
    .map_err(|e| e.to_string())?;
    Ok(Options {
        atol: args.atol,
        rtol: args.rtol,
        dtype: args.dtype.as_deref().and_then(parse_dtype),
        allow_unused: args.allow_unused,
        device,
        weights,
        model_config: config,
        allow_unknown_config: args.allow_unknown_config,
        trace: args.trace,
        strict: args.strict,
    })
}

/// The bundles under `paths`, with a note on what was passed over; `None` (the error said) when
/// a path cannot be read.
fn bundles(paths: &[PathBuf], err: &mut dyn Write) -> Option<Vec<PathBuf>> {
    let found = match crate::files::collect(paths) {
        Ok(found) => found,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return None;
        }
    };
    let names = |paths: &[PathBuf]| {
        let names: Vec<String> = paths.iter().map(|p| line(&p.display().to_string())).collect();
        names.join(", ")
    };
    if !found.skipped.is_empty() {
        let _ = writeln!(
            err,
            "note: skipped {} safetensors files without parity.* metadata (model checkpoints, not bundles): {}",
            found.skipped.len(),
            names(&found.skipped)
        );
    }
    if !found.links.is_empty() {
        let _ = writeln!(
            err,
            "note: did not follow {} symbolic links to folders (name the folder itself to check it): {}",
            found.links.len(),
            names(&found.links)
        );
    }
    Some(found.bundles)
}

/// Check each file, within the memory limit; a panic is that file's error.
fn check_all(files: &[PathBuf], opts: &Options, args: &CheckArgs) -> Results {
    let load = if opts.trace { Load::All } else { Load::NoStages };
    files
        .iter()
        .map(|f| {
            let checked = guard::catch(f, || {
                args.memory
                    .check_fits(f, load, opts.dtype.map(crate::check::dtype_name), opts.weights.as_ref())?;
                check_file(f, opts)
            });
            (f.clone(), checked)
        })
        .collect()
}

/// How many bundles passed, failed, were inconclusive, or could not be checked.
struct Counts {
    passed: usize,
    failed: usize,
    inconclusive: usize,
    errors: usize,
}

impl Counts {
    fn of(results: &Results) -> Self {
        let count = |want: Outcome| {
            results
                .iter()
                .filter(|(_, r)| matches!(r, Ok(r) if r.outcome == want))
                .count()
        };
        let (passed, failed, inconclusive) = (count(Outcome::Pass), count(Outcome::Fail), count(Outcome::Inconclusive));
        Self {
            passed,
            failed,
            inconclusive,
            errors: results.len() - passed - failed - inconclusive,
        }
    }

    /// An unusable bundle outranks a mismatch, which outranks an inconclusive one.
    fn exit_code(&self) -> i32 {
        if self.errors > 0 {
            EXIT_UNUSABLE
        } else if self.failed > 0 {
            EXIT_MISMATCH
        } else if self.inconclusive > 0 {
            EXIT_INCONCLUSIVE
        } else {
            EXIT_PASS
        }
    }
}

/// `--json`: one document with every report (or error), the counts and the exit code.
fn print_json(results: &Results, counts: &Counts, out: &mut dyn Write) {
    let items: Vec<serde_json::Value> = results
        .iter()
        .map(|(f, r)| match r {
            Ok(report) => serde_json::to_value(report).unwrap_or_default(),
            Err(e) => serde_json::json!({ "file": f.display().to_string(), "error": e.to_string() }),
        })
        .collect();
    let Counts {
        passed,
        failed,
        inconclusive,
        errors,
    } = counts;
    let doc = serde_json::json!({ "bundles": items, "passed": passed, "failed": failed, "inconclusive": inconclusive,
        "errors": errors, "exit_code": counts.exit_code() });
    let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
}

/// The table, then each bundle's errors, notes, trace and failing outputs, then the counts.
fn print_results(results: &Results, counts: &Counts, out: &mut dyn Write, err: &mut dyn Write) {
    print_table(results, out);
    for (_, r) in results {
        match r {
            Err(e) => {
                let _ = writeln!(err, "error: {e}");
            }
            Ok(report) => print_report(report, out, err),
        }
    }
    let Counts {
        passed,
        failed,
        inconclusive,
        errors,
    } = counts;
    let mut tail = String::new();
    if *inconclusive > 0 {
        tail.push_str(&format!(", {inconclusive} inconclusive"));
    }
    if *errors > 0 {
        tail.push_str(&format!(", {errors} unusable"));
    }
    let _ = writeln!(out, "{passed} passed, {failed} failed{tail}");
}

/// One checked bundle's notes (to `err`), its stage trace and failing outputs (to `out`).
fn print_report(report: &Report, out: &mut dyn Write, err: &mut dyn Write) {
    let file = line(&report.file);
    if let Some(w) = &report.weights {
        let _ = writeln!(err, "note: {file}: weights from {}", line(w));
    }
    if let Some(c) = &report.config_from {
        let _ = writeln!(err, "note: {file}: config from {}", line(c));
    }
    if let Some(note) = conversion_note(&report.conversions) {
        let _ = writeln!(err, "note: {file}: {}", line(&note));
    }
    if let Some(t) = &report.trace {
        print_trace(&report.file, t, out);
    }
    for o in report.outputs.iter().filter(|o| !o.pass) {
        let _ = writeln!(
            out,
            "{} {file} output `{}`: {}",
            Outcome::of(std::slice::from_ref(o)).word(),
            line(&o.name),
            line(o.reason.as_deref().unwrap_or(""))
        );
    }
}
