//! Stage-by-stage comparison (`check --trace`): the bundle's `parity.trace.<stage>` tensors,
//! recorded by the exporter's forward hooks, against the stages our block records through
//! [`unet_attention::trace`], in the bundle's stage order. The first stage that fails names where
//! the port diverges, with the usual causes for that stage.
//!
//! A stage passes under the rules of [`crate::compare`] at the run's tolerances, the rules an
//! output passes by: against PyTorch's stage and against the float64 copy's stage, with PyTorch's
//! own error as the yardstick. Bundles store the float64 stages as `parity.trace.<stage>.float64`
//! (half-precision bundles) or as `parity.trace.<stage>.float64_delta` (float32 bundles: the
//! float64 stage minus the float32 one, in bfloat16, so the reference is the stage plus the
//! delta, exact to 2^-9 of PyTorch's own error at each element). A stage without one (bundles
//! exported before) is judged by rule (a) alone. The `output` stage is the bundle's first output
//! and is judged exactly as the check judges it, in its own shape. Another stage of ours is
//! reshaped to PyTorch's when the element counts agree (layouts are documented in
//! `unet_attention::trace`).

use crate::bundle::{Bundle, FLOAT64_SUFFIX};
use crate::compare::{apply_strict, check_reference_within, compare, stage_twin_bounds, OutputReport};
use crate::error::{ParityError, Result};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;

/// Metadata key listing a bundle's stages in forward order.
pub const TRACE_KEY: &str = "parity.trace";
/// Tensor name prefix of a bundle's stages.
pub const TRACE_PREFIX: &str = "parity.trace.";
/// Suffix of a float32 bundle's float64 stages, stored as deltas from the stage.
pub const DELTA_SUFFIX: &str = ".float64_delta";
/// Metadata key of a bundle's trace mode: `modules` for stages named by module path, absent for
/// the named stages.
pub const TRACE_MODE_KEY: &str = "parity.trace_mode";
/// The attention core's stages, which no PyTorch submodule returns: the exporter records them
/// under each attention module's path (`attn1/q`, `attn1/probs`, ...).
pub const ATTENTION_CORE_STAGES: [&str; 6] = ["q", "k", "v", "probs", "context", "attn"];

/// One stage of the trace table.
#[derive(Debug, Clone, Serialize)]
pub struct StageReport {
    pub stage: String,
    /// PyTorch's shape of the stage.
    pub shape: Vec<usize>,
    /// Our shape, when we recorded the stage.
    pub ours_shape: Option<Vec<usize>>,
    /// The comparison (absent when we did not record the stage).
    pub compare: Option<OutputReport>,
    /// `match`, `DIVERGES`, `differs (no float64 twin)`, `not recorded`.
    pub status: String,
    /// Why the stage's float64 twin was not used, when the bundle had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub twin_note: Option<String>,
}

/// The stage-by-stage comparison of one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct TraceReport {
    pub stages: Vec<StageReport>,
    /// The first stage that diverges, named only when some output failed.
    pub first_divergence: Option<String>,
    /// Every output passed (then no stage is blamed).
    pub outputs_pass: bool,
    /// The usual causes of a divergence at that stage.
    pub hint: Option<String>,
    /// Stages we recorded that the bundle does not hold (not compared).
    pub ours_only: Vec<String>,
    /// The bundle's stages before the first divergence that were not recorded: the divergence
    /// may begin in any of them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unrecorded_before: Vec<String>,
    /// The bundle's stages are named by module path (`parity.trace_mode` = `modules`): the
    /// PyTorch submodules' outputs, which a block of ours records only in part.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub module_paths: bool,
    /// Why there is no table (no traces in the bundle, a run in another dtype).
    pub note: Option<String>,
}

/// The stage names a bundle lists in `parity.trace` (empty when it has none).
pub fn stage_names(bundle: &Bundle) -> Result<Vec<String>> {
    let Some(text) = bundle.metadata.get(TRACE_KEY) else {
        return Ok(vec![]);
    };
    let names: Vec<String> = serde_json::from_str(text).map_err(|e| {
        ParityError::bundle(
            &bundle.path,
            format!("metadata `{TRACE_KEY}` must be a JSON array of strings: {e}"),
        )
    })?;
    for n in &names {
        if n != "output" && !bundle.tensors.contains_key(&format!("{TRACE_PREFIX}{n}")) {
            return Err(ParityError::bundle(
                &bundle.path,
                format!("`{TRACE_KEY}` names `{n}` but tensor `{TRACE_PREFIX}{n}` is missing"),
            ));
        }
    }
    Ok(names)
}

/// PyTorch's tensor of stage `name` (`output`: the bundle's first output).
pub fn torch_stage<'a>(bundle: &'a Bundle, name: &str) -> Option<&'a Tensor> {
    if name == "output" {
        bundle.outputs.first().and_then(|o| bundle.output(o))
    } else {
        bundle.tensors.get(&format!("{TRACE_PREFIX}{name}"))
    }
}

/// The usual causes of a divergence first seen at `stage`.
pub fn hint(stage: &str) -> &'static str {
    // `attentions.0/norm1#2` -> `norm`
    let last = stage.rsplit('/').next().unwrap_or(stage);
    let name = last.split('#').next().unwrap_or(last);
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    // Module-path stages (`scripts/export_own.py --trace modules`) name diffusers' submodules.
    let base = match base {
        // `attn` itself is the named stage (the weighted sum, heads merged); `attn1`, `attn2` are
        // diffusers' whole attention modules.
        "attn" if name == "attn" => "attn",
        "group_norm" | "norm_cross" => "norm",
        "to_q" | "to_k" | "to_v" | "query" | "key" | "value" => "q",
        "to_out" | "proj_attn" => "proj",
        "time_emb_proj" => "temb",
        "conv_shortcut" | "nin_shortcut" => "shortcut",
        "ff" | "net" | "nonlinearity" => "act",
        "attentions" | "attn" | "transformer_blocks" => "attention",
        "resnets" => "resnet",
        other => other,
    };
    match base {
        "norm" | "spatial_norm" => {
            "the norm: eps (1e-5 vs 1e-6), number of groups, affine weight/bias, GroupNorm vs \
             RMSNorm/LayerNorm, statistics in f32, channels-first vs channels-last input"
        }
        "q" | "k" | "v" => {
            "the projections and head split: head layout ('(h d)' vs '(d h)'), fused qkv chunk order \
             ([Q|K|V] vs per-head [q_h|k_h|v_h]), transposed weight, projection bias, memory key/values, \
             qk_norm"
        }
        "probs" => {
            "the attention weights: scale (1/sqrt(d) missing, applied twice, d^-1/4 on q and k, \
             scale_qk), softmax axis, mask sign or broadcast, softmax upcast"
        }
        "context" => {
            "the linear-attention context: softmax axes (k over tokens, q over features), the q \
             scale, k·vᵀ order, memory key/values"
        }
        "attn" => {
            "the weighted sum and head merge: probs·v order, v layout, merging heads \
             ('b h n d -> b n (h d)' vs channels first)"
        }
        "proj" => "the output projection: weight/bias, transposed weight, layout fed to it",
        "proj_in" | "proj_out" => {
            "the projection: conv 1×1 vs linear (use_linear_projection), the layout fed to it \
             ((B, C, H, W) vs (B, H·W, C)), GEGLU/SwiGLU width (2× inner dim)"
        }
        "act" => "the activation: GELU exact vs tanh, GEGLU gate half (second chunk), SiLU vs Mish",
        "conv" => {
            "the convolution: kernel/padding, the activation before it (SiLU / Mish), dropout left \
             on, the time embedding added before instead of after"
        }
        "temb" => {
            "the time-embedding projection: the activation before the Linear (SiLU), scale/shift \
             order of the chunk, skip_time_act"
        }
        "shortcut" => "the shortcut: 1×1 (nin) vs 3×3 conv, use_in_shortcut, identity when channels match",
        "output" => {
            "after the last stage: residual (missing, or added twice), rescale_output_factor / \
             output_scale_factor, scale-shift (1 + scale), output reshape to (B, C, H, W)"
        }
        "attention" => {
            "an attention block as a whole: record its inner stages (norm, to_q/to_k/to_v, to_out, ff) to \
             narrow it down; the usual suspects are the norm's groups/eps, the head split, the scale, \
             the softmax upcast, GELU exact vs tanh in the feed-forward, and the residual"
        }
        "resnet" => {
            "a resnet as a whole: record norm1/conv1/time_emb_proj/norm2/conv2 to narrow it down; the \
             usual suspects are the GroupNorm groups and eps, the time-embedding add (before norm2) or \
             scale-shift, the shortcut, output_scale_factor"
        }
        _ => "no hint for this stage",
    }
}

/// [`hint`] for the first divergence `first` among `stages`, and, at an attention module's output
/// projection (`attn1/to_out.0`, `proj`) whose attention core was not compared (its `q`, `k`, `v`,
/// `probs`, `attn` not recorded, or not in the bundle), a word that the core is as likely: a
/// wrong scale or head split first shows at the projection then.
pub fn hint_in_context(stages: &[StageReport], first: &str) -> String {
    let base = hint(first).to_string();
    let (parent, last) = first.rsplit_once('/').unwrap_or(("", first));
    let last = last.split('#').next().unwrap_or(last);
    let projection = matches!(last, "to_out.0" | "proj_attn" | "proj" | "proj_out" | "to_out");
    if !projection || hint(first) != hint("proj") {
        return base;
    }
    let core = |s: &StageReport| {
        let (p, l) = s.stage.rsplit_once('/').unwrap_or(("", s.stage.as_str()));
        p == parent && ATTENTION_CORE_STAGES.contains(&l)
    };
    if stages.iter().any(|s| core(s) && s.compare.is_some()) {
        return base;
    }
    let at = |n: &str| {
        if parent.is_empty() {
            n.to_string()
        } else {
            format!("{parent}/{n}")
        }
    };
    let how = if stages.iter().any(core) {
        format!(
            "record `{}`, `{}`, `{}`, `{}` and `{}` in the layouts of docs/tracing.md to tell them apart",
            at("q"),
            at("k"),
            at("v"),
            at("probs"),
            at("attn")
        )
    } else {
        "the bundle has no stages inside the attention (re-export it with scripts/export_own.py, whose \
         module-path stages now include `q`, `k`, `v`, `probs`, `attn`)"
            .to_string()
    };
    format!(
        "{base}; or, as nothing before it inside the attention was compared, the attention core: the scale, the \
         head split, the softmax, the weighted sum and head merge ({how})"
    )
}

/// How stages are judged: by the verdict's own rule (its tolerances, `--strict`), knowing whether
/// the outputs passed.
#[derive(Debug, Clone, Copy)]
pub struct StageRule<'a> {
    pub rtol: f64,
    pub atol: f64,
    pub strict: bool,
    /// Every output passed: then no stage is named as the first divergence.
    pub outputs_pass: bool,
    /// The verdict's report of the first output: the `output` stage is that report, so the table
    /// and the verdict cannot disagree about it (its twin confirmed or not, `--strict` applied).
    pub output: Option<&'a OutputReport>,
}

/// Compare our recorded `ours` stages with the bundle's, each under the rule the outputs are
/// judged by ([`StageRule`]). A stage's float64 twin is used only when it passes the checks an
/// output's twin must pass ([`check_reference_within`], at [`stage_twin_bounds`]); otherwise it is
/// ignored, with a note, and the
/// stage is judged by rule (a) alone: failing that, it `differs`. The first stage in forward order
/// that diverges or differs is named, and only when some output failed: when the outputs pass, no
/// stage is blamed (the verdict is the outputs').
pub fn compare_stages(bundle: &Bundle, ours: &[(String, Tensor)], rule: &StageRule) -> Result<TraceReport> {
    let names = stage_names(bundle)?;
    let mut stages = vec![];
    for name in &names {
        let torch = torch_stage(bundle, name).expect("validated by stage_names");
        let mine = ours.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        stages.push(match mine {
            None => StageReport {
                stage: name.clone(),
                shape: torch.dims().to_vec(),
                ours_shape: None,
                compare: None,
                status: "not recorded".into(),
                twin_note: None,
            },
            Some(t) => match rule.output.filter(|_| name == "output") {
                Some(report) => StageReport {
                    stage: name.clone(),
                    shape: torch.dims().to_vec(),
                    ours_shape: Some(t.dims().to_vec()),
                    compare: Some(report.clone()),
                    status: if report.pass { "match" } else { DIVERGES }.into(),
                    twin_note: None,
                },
                None => compare_stage(bundle, name, t, torch, rule)?,
            },
        });
    }
    let first = if rule.outputs_pass {
        None
    } else {
        stages
            .iter()
            .find(|s| s.status == DIVERGES || s.status == DIFFERS)
            .map(|s| s.stage.clone())
    };
    // A forward that recorded nothing but its output (an opaque port): no stage narrows the
    // divergence down, and the block-internal causes of `output` are a guess; say what to record.
    let recorded_inside = stages.iter().any(|s| s.stage != "output" && s.compare.is_some());
    let hint = first.as_deref().map(|s| {
        if s == "output" && !recorded_inside && names.len() > 1 {
            nothing_recorded_hint(&names)
        } else {
            hint_in_context(&stages, s)
        }
    });
    let unrecorded_before = match first.as_deref() {
        Some(f) => stages
            .iter()
            .take_while(|s| s.stage != f)
            .filter(|s| s.compare.is_none())
            .map(|s| s.stage.clone())
            .collect(),
        None => vec![],
    };
    Ok(TraceReport {
        hint,
        unrecorded_before,
        first_divergence: first,
        module_paths: bundle.metadata.get(TRACE_MODE_KEY).map(String::as_str) == Some("modules"),
        outputs_pass: rule.outputs_pass,
        ours_only: ours
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| !names.contains(n))
            .collect(),
        note: if names.is_empty() {
            Some(
                "the bundle holds no stage traces (`parity.trace`): re-export it with scripts/parity_bundle.py's \
                 `export_bundle` (traces are on by default; `trace=True`) to compare stage by stage"
                    .into(),
            )
        } else {
            None
        },
        stages,
    })
}

/// What to do when a forward recorded none of the bundle's stages `names` and its output fails.
fn nothing_recorded_hint(names: &[String]) -> String {
    const SHOWN: usize = 6;
    let inner: Vec<&String> = names.iter().filter(|n| *n != "output").collect();
    let first: Vec<String> = inner.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
    let more = if inner.len() > SHOWN {
        format!(
            ", ... ({} in all; `unet-parity inspect BUNDLE` lists them)",
            inner.len()
        )
    } else {
        String::new()
    };
    format!(
        "the forward recorded none of the bundle's stages, so nothing narrows the divergence down: record \
         module outputs with `unet_parity::port::record(name, &tensor)` under the bundle's stage names ({}{more}), \
         in forward order, and the first one that diverges is named",
        first.join(", ")
    )
}

/// A stage's status when it fails with a usable float64 twin (or under `--strict`).
pub const DIVERGES: &str = "DIVERGES";
/// A stage's status when it fails rule (a) and has no usable float64 twin for rule (b).
pub const DIFFERS: &str = "differs (no float64 twin)";

/// One recorded stage against PyTorch's `torch` (see [`compare_stages`]).
fn compare_stage(bundle: &Bundle, name: &str, ours: &Tensor, torch: &Tensor, rule: &StageRule) -> Result<StageReport> {
    let err = |e: candle_core::Error| ParityError::bundle(&bundle.path, format!("stage {name}: {e}"));
    let t = ours.to_device(&Device::Cpu).map_err(err)?;
    let shape = t.dims().to_vec();
    // Not the `output` stage: the output is judged in its own shape, as the check judges it
    // (values in the wrong shape do not match).
    let reshape = name != "output" && t.elem_count() == torch.elem_count();
    let t = if reshape && t.dims() != torch.dims() {
        t.reshape(torch.dims()).map_err(err)?
    } else {
        t
    };
    let (twin, twin_note) = usable_twin(bundle, name, torch)?;
    let mut report = compare(name, &t, torch, twin.as_ref(), rule.rtol, rule.atol).map_err(err)?;
    if rule.strict {
        apply_strict(&mut report);
    }
    let status = if report.pass {
        "match"
    } else if twin.is_some() || rule.strict {
        DIVERGES
    } else {
        DIFFERS
    };
    Ok(StageReport {
        stage: name.to_string(),
        shape: torch.dims().to_vec(),
        ours_shape: Some(shape),
        compare: Some(report),
        status: status.into(),
        twin_note,
    })
}

/// The stage's float64 twin if the bundle holds one that passes [`check_reference_within`] at the
/// bundle's dtype; otherwise `None`, with why it was ignored when there was one.
fn usable_twin(bundle: &Bundle, name: &str, torch: &Tensor) -> Result<(Option<Tensor>, Option<String>)> {
    // A twin of the wrong shape or dtype is a broken bundle (an error); one whose values PyTorch's
    // rounding cannot explain is ignored with a note.
    let Some(twin) = float64_stage(bundle, name, torch)? else {
        return Ok((None, None));
    };
    let dtype = bundle.run_dtype()?;
    let finite = crate::compare::count_non_finite_values(&twin)
        .map_err(|e| ParityError::bundle(&bundle.path, format!("stage {name}: {e}")))?;
    let verdict = if finite > 0 {
        Err(format!("it holds {finite} NaN or infinite values"))
    } else {
        check_reference_within(torch, &twin, dtype, stage_twin_bounds(dtype))
            .map_err(|e| ParityError::bundle(&bundle.path, format!("stage {name}: {e}")))?
            .map_err(|problem| problem.to_string())
    };
    Ok(match verdict {
        Ok(()) => (Some(twin), None),
        Err(why) => (None, Some(format!("its float64 twin is ignored: {why}"))),
    })
}

/// The float64 copy's stage `name` (`output`: the bundle's float64 output), if the bundle holds
/// it: stored as it is, or as a delta from PyTorch's stage `torch` (which must have its shape).
pub fn float64_stage(bundle: &Bundle, name: &str, torch: &Tensor) -> Result<Option<Tensor>> {
    if name == "output" {
        return Ok(bundle.outputs.first().and_then(|o| bundle.output_f64(o)).cloned());
    }
    if let Some(t) = bundle.tensors.get(&format!("{TRACE_PREFIX}{name}{FLOAT64_SUFFIX}")) {
        return Ok(Some(t.clone()));
    }
    let key = format!("{TRACE_PREFIX}{name}{DELTA_SUFFIX}");
    let Some(delta) = bundle.tensors.get(&key) else {
        return Ok(None);
    };
    if delta.dims() != torch.dims() || !delta.dtype().is_float() {
        return Err(ParityError::bundle(
            &bundle.path,
            format!(
                "tensor `{key}` must be a float tensor of the stage's shape {:?}, found {:?} {:?}",
                torch.dims(),
                delta.dtype(),
                delta.dims()
            ),
        ));
    }
    let sum = torch
        .to_dtype(DType::F64)
        .and_then(|t| t.add(&delta.to_dtype(DType::F64)?))
        .map_err(|e| ParityError::bundle(&bundle.path, format!("stage {name}: {e}")))?;
    Ok(Some(sum))
}

/// A trace report without a table.
pub fn without_table(note: impl Into<String>) -> TraceReport {
    TraceReport {
        stages: vec![],
        first_divergence: None,
        outputs_pass: false,
        hint: None,
        ours_only: vec![],
        unrecorded_before: vec![],
        module_paths: false,
        note: Some(note.into()),
    }
}

/// The bundle stage whose name is closest to `name` (fewest single-character edits; the first
/// in forward order on a tie), when one is within half of `name`'s length.
pub fn closest_stage<'a>(name: &str, stages: &'a [StageReport]) -> Option<&'a str> {
    let best = stages
        .iter()
        .map(|s| (unet_attention::weights::edit_distance(name, &s.stage), s.stage.as_str()))
        .min_by_key(|(d, _)| *d)?;
    (best.0 * 2 <= name.chars().count().max(2)).then_some(best.1)
}

/// A number as the tables print it (`-` for NaN).
pub(crate) fn sci(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.2e}")
    }
}

/// The stage table, indented by two spaces, then the first divergence and its usual causes (or
/// "no stage diverges"); every cell on one line with nothing a terminal would act on.
impl std::fmt::Display for TraceReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.render(f, false)
    }
}

impl TraceReport {
    /// The first stage that differs from PyTorch beyond its rounding error while every output
    /// passes: flagged on the verdict line.
    pub fn diverging_under_pass(&self) -> Option<&str> {
        if !self.outputs_pass {
            return None;
        }
        self.stages
            .iter()
            .find(|s| s.status == DIVERGES || s.status == DIFFERS)
            .map(|s| s.stage.as_str())
    }

    /// The table as `Display` writes it. For a user's port (`port`), the stages it did not record
    /// are counted in one line instead of listed (a port records a few stages of many), and the
    /// names it recorded that the bundle lacks are listed with the closest bundle stage. Our own
    /// block on a bundle of module-path stages is shown the same way (it records the named stages
    /// only, so most module paths are not its names).
    pub fn render(&self, f: &mut impl std::fmt::Write, port: bool) -> std::fmt::Result {
        let line = |s: &str| crate::terminal::one_line(s).into_owned();
        if let Some(note) = &self.note {
            writeln!(f, "  ({})", line(note))?;
        }
        let recorded_only = port || self.module_paths;
        let mut rows: Vec<[String; 6]> =
            vec![["STAGE", "SHAPE(torch)", "SHAPE(ours)", "MAX_ABS", "MAX_REL", "RESULT"].map(String::from)];
        let skipped = self
            .stages
            .iter()
            .filter(|s| recorded_only && s.compare.is_none())
            .count();
        for s in self.stages.iter().filter(|s| !recorded_only || s.compare.is_some()) {
            let (abs, rel) = s
                .compare
                .as_ref()
                .map_or(("-".into(), "-".into()), |c| (sci(c.max_abs), sci(c.max_rel)));
            let shape = |d: &[usize]| format!("{d:?}").replace(' ', "");
            rows.push([
                s.stage.clone(),
                shape(&s.shape),
                s.ours_shape.as_deref().map_or("-".into(), shape),
                abs,
                rel,
                s.status.clone(),
            ]);
        }
        if !self.stages.is_empty() {
            let rows: Vec<[String; 6]> = rows.into_iter().map(|r| r.map(|c| line(&c))).collect();
            let widths: Vec<usize> = (0..6)
                .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
                .collect();
            for row in rows {
                let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
                writeln!(f, "  {}", cells.join("  ").trim_end())?;
            }
        }
        if skipped > 0 && port {
            writeln!(
                f,
                "  ({skipped} of the bundle's {} stages not recorded; record them to narrow a divergence down)",
                self.stages.len()
            )?;
        } else if skipped > 0 {
            writeln!(
                f,
                "  ({skipped} of the bundle's {} stages not shown: they are PyTorch submodules' outputs named by module \
                 path (`{TRACE_MODE_KEY}` = modules), which our block does not record under those names; a bundle \
                 exported with the named stages (scripts/export_own.py without --trace modules) is traced in full)",
                self.stages.len()
            )?;
        }
        if port {
            self.render_unknown_names(f)?;
            self.render_unrecorded_before(f)?;
        }
        for s in self.stages.iter().filter(|s| s.twin_note.is_some()) {
            writeln!(
                f,
                "  note: stage `{}`: {}",
                line(&s.stage),
                line(s.twin_note.as_deref().unwrap_or(""))
            )?;
        }
        let failing = self.stages.iter().find(|s| s.status == DIVERGES || s.status == DIFFERS);
        match (&self.first_divergence, &self.hint, failing) {
            (Some(stage), Some(hint), _) => writeln!(f, "  first divergence: `{}` — usual causes: {hint}", line(stage)),
            (_, _, Some(s)) if self.outputs_pass => writeln!(
                f,
                "  warning: the outputs pass, but stage `{}` differs from PyTorch beyond its rounding error: a real \
                 difference there can hide under the output's rounding; check the bundle's float32 twin, `--dtype \
                 f64`, or `--strict`",
                line(&s.stage)
            ),
            _ if !self.stages.is_empty() => writeln!(f, "  no stage diverges"),
            _ => Ok(()),
        }
    }

    /// The names a port recorded that the bundle does not hold, each with the closest stage name
    /// it does hold, in one line: a misspelled name is never silently `not recorded`, and the many
    /// internal stages a block of ours records inside a [`crate::port::scope`] do not flood the
    /// report.
    fn render_unknown_names(&self, f: &mut impl std::fmt::Write) -> std::fmt::Result {
        const SHOWN: usize = 4;
        if self.ours_only.is_empty() || self.stages.is_empty() {
            return Ok(());
        }
        let line = |s: &str| crate::terminal::one_line(s).into_owned();
        let named: Vec<String> = self
            .ours_only
            .iter()
            .take(SHOWN)
            .map(|name| match closest_stage(name, &self.stages) {
                Some(near) => format!("`{}` (closest: `{}`)", line(name), line(near)),
                None => format!("`{}`", line(name)),
            })
            .collect();
        let more = match self.ours_only.len().saturating_sub(SHOWN) {
            0 => String::new(),
            n => format!(", and {n} more"),
        };
        writeln!(
            f,
            "  recorded but not in the bundle, so not compared ({} name{}): {}{more}",
            self.ours_only.len(),
            if self.ours_only.len() == 1 { "" } else { "s" },
            named.join(", ")
        )
    }

    /// The bundle's stages before the first divergence that the port did not record, in one line.
    fn render_unrecorded_before(&self, f: &mut impl std::fmt::Write) -> std::fmt::Result {
        const SHOWN: usize = 8;
        let (Some(first), false) = (&self.first_divergence, self.unrecorded_before.is_empty()) else {
            return Ok(());
        };
        let line = |s: &str| crate::terminal::one_line(s).into_owned();
        let names: Vec<String> = self
            .unrecorded_before
            .iter()
            .take(SHOWN)
            .map(|n| format!("`{}`", line(n)))
            .collect();
        let more = match self.unrecorded_before.len().saturating_sub(SHOWN) {
            0 => String::new(),
            n => format!(", and {n} more"),
        };
        writeln!(
            f,
            "  not recorded before `{}` ({} stage{}; the divergence may begin in any of them): {}{more}",
            line(first),
            self.unrecorded_before.len(),
            if self.unrecorded_before.len() == 1 { "" } else { "s" },
            names.join(", ")
        )
    }
}
