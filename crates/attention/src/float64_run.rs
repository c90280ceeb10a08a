//! How a float64 run treats the steps that PyTorch's code computes in float32 whatever the
//! module's dtype: the twin conventions of a parity bundle's float64 output.
//!
//! A bundle's `parity.output.<name>.float64` is PyTorch's run of the block in float64. Two kinds of
//! step stay float32 in such a run, or may:
//!
//! * **Float32 embeddings**: diffusers' `get_timestep_embedding` (the `Timesteps` of
//!   `UNet2DConditionModel` and the frame embedding of `TransformerSpatioTemporalModel`) builds
//!   its sinusoids in float32 in every dtype (`arange(..., dtype=float32)`,
//!   `timesteps[:, None].float()`), then casts them to the model's dtype. A float64 run of ours
//!   does the same ([`Embeddings::AsPyTorch`], the default). PyTorch's vectorised `exp`/`sin`/`cos`
//!   may round one unit in the last place away from ours, so the float64 outputs may differ by
//!   the effect of such a rounding: [`Embeddings::Exact`] computes the embeddings in float64
//!   instead, and the difference between the two runs measures that effect (`unet-parity`'s
//!   float64 check allows for it).
//! * **Published float32 casts**: a published forward's explicit `.float()` (guided-diffusion's
//!   `softmax(weight.float())`, diffusers' `upcast_attention` / `upcast_softmax` in
//!   `get_attention_scores`, diffusers `RMSNorm`'s float32 variance) is a float32 step in a plain
//!   `module.double()` run ([`Casts::Kept`]), and float64 in the exporters' twins, which switch
//!   those casts off ([`Casts::Off`], the default: `scripts/parity/float64.py`).
//!   `GroupNorm32`'s cast and SD 2.x `CrossAttention`'s cannot run in float64 at all (PyTorch
//!   refuses the mixed dtypes), so every twin runs them in float64.
//!
//! The settings hold for the current thread inside [`with`] (a block builds its ops on the
//! calling thread) and matter in float64 runs only: in float32, float16 and bfloat16 the
//! embeddings are float32 and the casts upcast, as PyTorch runs them.

use std::cell::Cell;

/// The float32 embeddings of a float64 run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Embeddings {
    /// Built in float32 and cast to float64, as PyTorch builds them.
    #[default]
    AsPyTorch,
    /// Built in float64: how much the float32 rounding moves the output.
    Exact,
}

/// The published forwards' `.float()` casts in a float64 run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Casts {
    /// Switched off (float64 throughout), as the exporters' twins run them.
    #[default]
    Off,
    /// Kept (a float32 step), as a plain `module.double()` runs them.
    Kept,
}

/// How a float64 run treats PyTorch's float32 steps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Float64Run {
    pub embeddings: Embeddings,
    pub casts: Casts,
}

thread_local! {
    static CURRENT: Cell<Float64Run> = const { Cell::new(Float64Run { embeddings: Embeddings::AsPyTorch, casts: Casts::Off }) };
    static EMBEDDED: Cell<bool> = const { Cell::new(false) };
    static CAST: Cell<bool> = const { Cell::new(false) };
}

/// What the steps of a run met (see [`with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepsMet {
    /// A float32 embedding was built.
    pub embeddings: bool,
    /// A published `.float()` cast was met (in any dtype).
    pub casts: bool,
}

/// Run `f` with `settings` on this thread; returns its result and which of the steps above it
/// met, so that a caller knows whether a run under other settings could differ.
pub fn with<R>(settings: Float64Run, f: impl FnOnce() -> R) -> (R, StepsMet) {
    let before = (
        CURRENT.with(|c| c.replace(settings)),
        EMBEDDED.with(|e| e.replace(false)),
        CAST.with(|c| c.replace(false)),
    );
    let out = f();
    let met = StepsMet {
        embeddings: EMBEDDED.with(|e| e.replace(before.1)),
        casts: CAST.with(|c| c.replace(before.2)),
    };
    CURRENT.with(|c| c.set(before.0));
    (out, met)
}

/// The settings on this thread.
pub fn current() -> Float64Run {
    CURRENT.with(|c| c.get())
}

/// Called where a float32 embedding is built: whether to build it in float64 instead.
pub fn embeddings_exact() -> bool {
    EMBEDDED.with(|e| e.set(true));
    current().embeddings == Embeddings::Exact
}

/// Called at a published `.float()` cast: whether a float64 value is rounded to float32 there.
pub fn casts_kept() -> bool {
    CAST.with(|c| c.set(true));
    current().casts == Casts::Kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_hold_inside_and_are_restored() {
        let kept = Float64Run {
            casts: Casts::Kept,
            ..Default::default()
        };
        let ((inner, met), outer) = (
            with(kept, || {
                let inner = (casts_kept(), embeddings_exact());
                // nested: the outer run's record is not lost
                let (_, met) = with(Float64Run::default(), casts_kept);
                assert!(met.casts && !met.embeddings);
                inner
            }),
            current(),
        );
        assert_eq!(inner, (true, false));
        assert!(met.casts && met.embeddings);
        assert_eq!(outer, Float64Run::default());
        let (_, met) = with(Float64Run::default(), || ());
        assert_eq!(met, StepsMet::default());
    }
}
