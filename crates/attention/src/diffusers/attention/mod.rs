//! `diffusers.models.attention_processor.Attention` (diffusers 0.42.1), run with one of the
//! processors `AttnProcessor2_0` (the default), `AttnProcessor` (the default when
//! `scale_qk=False`), or the UnCLIP / `SimpleCrossAttn` processors `AttnAddedKVProcessor2_0` and
//! `AttnAddedKVProcessor`.
//!
//! This covers the spatial self-attention of the U-Net and VAE mid blocks (`group_norm`,
//! `to_q`/`to_k`/`to_v`/`to_out.0`, `residual_connection`, `rescale_output_factor`), the MoVQ
//! decoder's `spatial_norm` (input `temb`), cross-attention through `encoder_hidden_states`
//! (with `cross_attention_norm`), `qk_norm`, and the added key/value projections
//! (`add_k_proj`/`add_v_proj`, `only_cross_attention`), for token `(B, N, C)` and image
//! `(B, C, H, W)` inputs. Checkpoints saved by diffusers ≤ 0.16 (and never re-saved, such as
//! `google/ddpm-*`) name the projections `query`/`key`/`value`/`proj_attn`; both spellings load.
//!
//! What each processor reads, mirrored exactly (weights a processor does not read are still
//! loaded, so a strict load of the state dict succeeds):
//!
//! | | `AttnProcessor2_0` | `AttnProcessor` | `AttnAddedKVProcessor2_0` | `AttnAddedKVProcessor` |
//! |---|---|---|---|---|
//! | scale | `1/sqrt(head_dim)` | `dim_head^-½` or 1 (`scale_qk`) | `1/sqrt(head_dim)` | `dim_head^-½` or 1 |
//! | `spatial_norm` (`temb`) | yes | yes | ignored | ignored |
//! | `qk_norm` (`norm_q`, `norm_k`) | yes | ignored | ignored | ignored |
//! | `norm_added_q`, `norm_added_k` | ignored | ignored | ignored | ignored |
//! | `group_norm` | optional | optional | required | required |
//! | `added_kv_proj_dim` | rejected | rejected | yes | yes |
//! | residual | `residual_connection` | `residual_connection` | always | always |
//! | `rescale_output_factor` | yes | yes | ignored | ignored |
//! | bool mask | yes | rejected (baddbmm) | yes | rejected (baddbmm) |
//!
//! Rejected, with an error: `kv_heads` unless `dim_head · kv_heads` equals the inner dim (any
//! other value breaks every one of these processors in diffusers), `added_kv_proj_dim` under the
//! processors that would ignore it, and the joint-attention options `out_context_dim`,
//! `context_pre_only` and `pre_only`.
//!
//! The block is split along diffusers' own seams: `config` (`Attention.__init__`'s keyword
//! arguments), `rules` (what `__init__` and the processors reject, and the sizes and scale a
//! config resolves to), `norms` (the norms `__init__` builds), `processors` (the processors'
//! `__call__`s and their attention) and `masks` (`prepare_attention_mask`).

mod config;
mod masks;
mod norms;
mod processors;
mod rules;

pub use config::{AttentionConfig, CrossAttentionNorm, Processor, QkNorm};

use crate::layers::{GroupNorm, Projection, SpatialNorm};
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use norms::{CrossNorm, HeadNorm, Norms};
use rules::Resolved;

/// `diffusers.models.attention_processor.Attention`.
#[derive(Debug, Clone)]
pub struct Attention {
    processor: Processor,
    group_norm: Option<GroupNorm>,
    /// Only when the processor applies it.
    spatial_norm: Option<SpatialNorm>,
    norm_cross: Option<CrossNorm>,
    /// Only when the processor applies them (`AttnProcessor2_0`).
    norm_q: Option<HeadNorm>,
    norm_k: Option<HeadNorm>,
    to_q: Projection,
    /// Absent with `only_cross_attention`.
    to_k: Option<Projection>,
    to_v: Option<Projection>,
    add_k_proj: Option<Projection>,
    add_v_proj: Option<Projection>,
    to_out: Projection,
    heads: usize,
    scale: f64,
    query_dim: usize,
    /// Width `encoder_hidden_states` must have.
    context_dim: usize,
    residual_connection: bool,
    rescale_output_factor: f64,
    upcast_attention: bool,
    upcast_softmax: bool,
}

/// The projections of `Attention.__init__`, under the names of the checkpoint.
struct Projections {
    to_q: Projection,
    to_k: Option<Projection>,
    to_v: Option<Projection>,
    add_k_proj: Option<Projection>,
    add_v_proj: Option<Projection>,
    to_out: Projection,
}

impl Projections {
    /// `to_q`/`to_k`/`to_v`/`to_out.0` (or diffusers ≤ 0.16's `query`/`key`/`value`/`proj_attn`)
    /// and `add_k_proj`/`add_v_proj`.
    fn load(vb: &VarBuilder, cfg: &AttentionConfig, r: &Resolved) -> Result<Self> {
        let block = Attention::BLOCK;
        let legacy = vb.contains_tensor("query.weight");
        let [q, k, v, out] = if legacy {
            ["query", "key", "value", "proj_attn"]
        } else {
            ["to_q", "to_k", "to_v", "to_out.0"]
        };
        let to_q = Projection::load(vb.pp(q), block, cfg.query_dim, r.inner_dim, cfg.bias)?;
        let (to_k, to_v) = if cfg.only_cross_attention {
            (None, None)
        } else {
            (
                Some(Projection::load(
                    vb.pp(k),
                    block,
                    r.cross_dim,
                    r.inner_kv_dim,
                    cfg.bias,
                )?),
                Some(Projection::load(
                    vb.pp(v),
                    block,
                    r.cross_dim,
                    r.inner_kv_dim,
                    cfg.bias,
                )?),
            )
        };
        let (add_k_proj, add_v_proj) = match cfg.added_kv_proj_dim {
            Some(added) => {
                let load =
                    |name: &str| Projection::load(vb.pp(name), block, added, r.inner_kv_dim, cfg.added_proj_bias);
                (Some(load("add_k_proj")?), Some(load("add_v_proj")?))
            }
            None => (None, None),
        };
        let to_out = Projection::load(vb.pp(out), block, r.inner_dim, r.out_features, cfg.out_bias)?;
        Ok(Self {
            to_q,
            to_k,
            to_v,
            add_k_proj,
            add_v_proj,
            to_out,
        })
    }
}

impl Attention {
    pub const BLOCK: &'static str = "diffusers.Attention";

    pub fn new(vb: VarBuilder, cfg: &AttentionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let resolved = rules::resolve(cfg)?;
        let Norms {
            group_norm,
            spatial_norm,
            norm_q,
            norm_k,
            norm_cross,
        } = Norms::load(&vb, cfg, &resolved)?;
        let Projections {
            to_q,
            to_k,
            to_v,
            add_k_proj,
            add_v_proj,
            to_out,
        } = Projections::load(&vb, cfg, &resolved)?;
        Ok(Self {
            processor: resolved.processor,
            group_norm,
            spatial_norm,
            norm_cross,
            norm_q,
            norm_k,
            to_q,
            to_k,
            to_v,
            add_k_proj,
            add_v_proj,
            to_out,
            heads: resolved.heads,
            scale: resolved.scale,
            query_dim: cfg.query_dim,
            context_dim: cfg.added_kv_proj_dim.unwrap_or(resolved.cross_dim),
            residual_connection: cfg.residual_connection,
            rescale_output_factor: cfg.rescale_output_factor,
            upcast_attention: cfg.upcast_attention,
            upcast_softmax: cfg.upcast_softmax,
        })
    }

    /// The processor this block runs.
    pub fn processor(&self) -> Processor {
        self.processor
    }

    /// `forward(hidden_states, encoder_hidden_states=None, attention_mask=None)`.
    ///
    /// `hidden_states`: `(B, N, query_dim)` or `(B, query_dim, H, W)` (the added-KV processors
    /// read any input as channels-first `(B, query_dim, ...)`); `encoder_hidden_states`:
    /// `(B, S, cross_attention_dim)` (`added_kv_proj_dim` wide for the added-KV processors);
    /// `attention_mask`: additive float or (SDPA processors only) boolean, shaped as diffusers'
    /// `prepare_attention_mask` takes it, e.g. `(B, S)`, `(B, 1, S)`, `(B, N, S)` or
    /// `(B·heads, ·, S)`.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        self.forward_with_temb(hidden_states, encoder_hidden_states, attention_mask, None)
    }

    /// [`Attention::forward`] with the processors' `temb` argument: the `zq` map
    /// `(B, spatial_norm_dim, h, w)` that `spatial_norm` conditions on (nearest-interpolated to
    /// the input's `(H, W)`). Required when `spatial_norm_dim` is set under
    /// `AttnProcessor2_0`/`AttnProcessor`; ignored otherwise, as in diffusers.
    pub fn forward_with_temb(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        temb: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        if let Some(context) = encoder_hidden_states {
            self.check_context(hidden_states, context)?;
        }
        if self.processor.is_added_kv() {
            self.forward_added_kv(hidden_states, encoder_hidden_states, attention_mask)
        } else {
            self.forward_standard(hidden_states, encoder_hidden_states, attention_mask, temb)
        }
    }

    fn check_context(&self, hidden_states: &Tensor, context: &Tensor) -> Result<()> {
        let batch = hidden_states.dims().first().copied().unwrap_or(0);
        if context.rank() != 3 || context.dim(0)? != batch || context.dim(2)? != self.context_dim {
            return Err(Error::input(
                Self::BLOCK,
                "encoder_hidden_states",
                format!(
                    "expected (B={batch}, S, {}), found {:?}",
                    self.context_dim,
                    context.dims()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::masks::repeat_interleave;
    use super::*;
    use crate::config::from_json;
    use crate::test_support::max_diff;
    use candle_core::DType;
    use candle_core::Device;
    use serde_json::json;
    use std::collections::HashMap;

    fn cfg(value: serde_json::Value) -> AttentionConfig {
        from_json(Attention::BLOCK, &value).unwrap()
    }

    fn empty() -> VarBuilder<'static> {
        VarBuilder::from_tensors(HashMap::new(), DType::F32, &Device::Cpu)
    }

    fn err(value: serde_json::Value) -> String {
        Attention::new(empty(), &cfg(value)).unwrap_err().to_string()
    }

    /// Random weights under the given names and shapes.
    fn weights(entries: &[(&str, &[usize])]) -> VarBuilder<'static> {
        let dev = Device::Cpu;
        let ts = entries
            .iter()
            .map(|(name, shape)| (name.to_string(), Tensor::randn(0f32, 0.3, *shape, &dev).unwrap()))
            .collect::<HashMap<_, _>>();
        VarBuilder::from_tensors(ts, DType::F32, &dev)
    }

    #[test]
    fn new_gives_the_diffusers_defaults() {
        let parsed = cfg(json!({"query_dim": 320}));
        let built = AttentionConfig::new(320);
        assert_eq!(format!("{parsed:?}"), format!("{built:?}"));
        assert_eq!(built.resolved_processor(), Processor::AttnProcessor2_0);
        let classic = AttentionConfig {
            scale_qk: false,
            ..AttentionConfig::new(8)
        };
        assert_eq!(classic.resolved_processor(), Processor::AttnProcessor);
    }

    #[test]
    fn unknown_kinds_are_config_errors() {
        let e = from_json::<AttentionConfig>(Attention::BLOCK, &json!({"query_dim": 8, "qk_norm": "batch_norm"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid config") && e.contains("batch_norm"), "{e}");
        let e = from_json::<AttentionConfig>(
            Attention::BLOCK,
            &json!({"query_dim": 8, "cross_attention_norm": "rms_norm"}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rms_norm"), "{e}");
        let e = from_json::<AttentionConfig>(Attention::BLOCK, &json!({"query_dim": 8, "processor": "XFormers"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("XFormers"), "{e}");
    }

    #[test]
    fn joint_attention_options_are_rejected() {
        for extra in [
            json!({"out_context_dim": 16}),
            json!({"context_pre_only": false}),
            json!({"pre_only": true}),
        ] {
            let mut c = json!({"query_dim": 16, "heads": 2, "dim_head": 8});
            c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            let e = err(c);
            assert!(e.contains("not supported") && e.contains("joint-attention"), "{e}");
        }
    }

    #[test]
    fn kv_heads_only_when_it_matches_the_query_heads() {
        let e = err(json!({"query_dim": 16, "heads": 4, "kv_heads": 2, "dim_head": 4}));
        assert!(e.contains("not supported") && e.contains("kv_heads"), "{e}");
        let vb = weights(&[
            ("to_q.weight", &[16, 16]),
            ("to_k.weight", &[16, 16]),
            ("to_v.weight", &[16, 16]),
            ("to_out.0.weight", &[16, 16]),
            ("to_out.0.bias", &[16]),
        ]);
        let c = cfg(json!({"query_dim": 16, "heads": 4, "kv_heads": 4, "dim_head": 4}));
        Attention::new(vb, &c).unwrap();
    }

    #[test]
    fn added_kv_options_need_the_added_kv_processors() {
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "only_cross_attention": true}));
        assert!(e.contains("only_cross_attention"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12}));
        assert!(e.contains("not supported") && e.contains("AttnAddedKVProcessor"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "processor": "AttnProcessor"}),
        );
        assert!(e.contains("not supported"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "norm_num_groups": 4,
                           "processor": "AttnAddedKVProcessor2_0"}));
        assert!(e.contains("added_kv_proj_dim"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "processor": "AttnAddedKVProcessor"}),
        );
        assert!(e.contains("norm_num_groups"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "norm_num_groups": 4, "out_dim": 8, "processor": "AttnAddedKVProcessor"}),
        );
        assert!(e.contains("out_dim"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 4, "added_kv_proj_dim": 12,
                           "norm_num_groups": 4, "processor": "AttnAddedKVProcessor2_0"}),
        );
        assert!(e.contains("inner dim"), "{e}");
        let e = err(
            json!({"query_dim": 16, "heads": 2, "dim_head": 8, "added_kv_proj_dim": 12,
                           "norm_num_groups": 4, "cross_attention_norm": "layer_norm",
                           "processor": "AttnAddedKVProcessor2_0"}),
        );
        assert!(e.contains("LayerNorm(16)"), "{e}");
    }

    #[test]
    fn qk_norm_shapes_diffusers_cannot_run_are_rejected() {
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "qk_norm": "rms_norm_across_heads"}));
        assert!(e.contains("kv_heads"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "kv_heads": 2, "dim_head": 8,
                           "qk_norm": "layer_norm_across_heads"}));
        assert!(e.contains("heads of 8"), "{e}");
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 8, "qk_norm": "l2",
                           "added_kv_proj_dim": 16, "norm_num_groups": 4,
                           "processor": "AttnAddedKVProcessor"}));
        assert!(e.contains("ValueError"), "{e}");
        // out_dim makes the head dim differ from dim_head: norm_q(LayerNorm(dim_head)) fails.
        let e = err(json!({"query_dim": 16, "heads": 2, "dim_head": 5, "out_dim": 12, "qk_norm": "layer_norm"}));
        assert!(e.contains("heads of 6"), "{e}");
    }

    #[test]
    fn attn_processor_loads_but_ignores_qk_norm() {
        let entries: Vec<(&str, &[usize])> = vec![
            ("to_q.weight", &[16, 16]),
            ("to_k.weight", &[16, 16]),
            ("to_v.weight", &[16, 16]),
            ("to_out.0.weight", &[16, 16]),
            ("to_out.0.bias", &[16]),
            ("norm_q.weight", &[8]),
            ("norm_q.bias", &[8]),
            ("norm_k.weight", &[8]),
            ("norm_k.bias", &[8]),
        ];
        let vb = weights(&entries);
        let x = Tensor::randn(0f32, 1., (2, 5, 16), &Device::Cpu).unwrap();
        let base = json!({"query_dim": 16, "heads": 2, "dim_head": 8, "processor": "AttnProcessor"});
        let plain = Attention::new(vb.clone(), &cfg(base.clone())).unwrap();
        let mut with_norm = base.clone();
        with_norm["qk_norm"] = json!("layer_norm");
        let ignored = Attention::new(vb.clone(), &cfg(with_norm.clone())).unwrap();
        assert_eq!(
            max_diff(
                &plain.forward(&x, None, None).unwrap(),
                &ignored.forward(&x, None, None).unwrap()
            ),
            0.0
        );
        with_norm["processor"] = json!("AttnProcessor2_0");
        let applied = Attention::new(vb, &cfg(with_norm)).unwrap();
        assert!(
            max_diff(
                &plain.forward(&x, None, None).unwrap(),
                &applied.forward(&x, None, None).unwrap()
            ) > 1e-3
        );
    }

    #[test]
    fn spatial_norm_needs_temb() {
        let vb = weights(&[
            ("to_q.weight", &[32, 32]),
            ("to_k.weight", &[32, 32]),
            ("to_v.weight", &[32, 32]),
            ("to_out.0.weight", &[32, 32]),
            ("to_out.0.bias", &[32]),
            ("spatial_norm.norm_layer.weight", &[32]),
            ("spatial_norm.norm_layer.bias", &[32]),
            ("spatial_norm.conv_y.weight", &[32, 4, 1, 1]),
            ("spatial_norm.conv_y.bias", &[32]),
            ("spatial_norm.conv_b.weight", &[32, 4, 1, 1]),
            ("spatial_norm.conv_b.bias", &[32]),
        ]);
        let a = Attention::new(
            vb,
            &cfg(json!({"query_dim": 32, "heads": 1, "dim_head": 32, "spatial_norm_dim": 4})),
        )
        .unwrap();
        let x = Tensor::randn(0f32, 1., (2, 32, 3, 5), &Device::Cpu).unwrap();
        let e = a.forward(&x, None, None).unwrap_err().to_string();
        assert!(e.contains("temb"), "{e}");
        let zq = Tensor::randn(0f32, 1., (2, 4, 2, 2), &Device::Cpu).unwrap();
        let y = a.forward_with_temb(&x, None, None, Some(&zq)).unwrap();
        assert_eq!(y.dims(), x.dims());
    }

    #[test]
    fn mask_preparation_follows_diffusers() {
        let dev = Device::Cpu;
        let vb = weights(&[
            ("to_q.weight", &[6, 6]),
            ("to_k.weight", &[6, 6]),
            ("to_v.weight", &[6, 6]),
            ("to_out.0.weight", &[6, 6]),
            ("to_out.0.bias", &[6]),
        ]);
        let a = Attention::new(
            vb.clone(),
            &cfg(json!({"query_dim": 6, "heads": 3, "dim_head": 2, "processor": "AttnProcessor"})),
        )
        .unwrap();
        // (B=1, S=4) float mask: repeat_interleave to (3, 4), which baddbmm broadcasts as rows of
        // the query axis: only valid when batch * heads == q_len (here 3).
        let m = Tensor::new(&[[0f32, -1., -2., -3.]], &dev).unwrap();
        let p = a.attention_mask(&m, 4, 1, 3, 4).unwrap();
        assert_eq!(p.dims(), &[1, 3, 3, 4]);
        let e = a.attention_mask(&m, 4, 1, 5, 4).unwrap_err().to_string();
        assert!(e.contains("baddbmm"), "{e}");
        let b = Tensor::new(&[[1u8, 0, 1, 1]], &dev).unwrap();
        assert!(a.attention_mask(&b, 4, 1, 3, 4).is_err());
        // Under SDPA a bool mask padded by the quirk gets False (-inf) in the new columns.
        let s = Attention::new(
            vb,
            &cfg(json!({"query_dim": 6, "heads": 3, "dim_head": 2, "processor": "AttnProcessor2_0"})),
        )
        .unwrap();
        let b = Tensor::new(&[[[1u8, 0]]], &dev).unwrap();
        let p = s.attention_mask(&b, 2, 1, 3, 2).unwrap();
        let row = p
            .get(0)
            .unwrap()
            .get(2)
            .unwrap()
            .get(1)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(row, vec![0.0, f32::NEG_INFINITY]);
        assert_eq!(
            repeat_interleave(&Tensor::new(&[1f32, 2.], &dev).unwrap(), 2, 0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            vec![1., 1., 2., 2.]
        );
    }

    #[test]
    fn nearest_interpolation_indices_match_torch() {
        // F.interpolate(torch.arange(n).view(1, 1, 1, n), size=(1, m), mode="nearest").
        use crate::layers::nearest_source_indices;
        assert_eq!(nearest_source_indices(7, 3), vec![0, 2, 4]);
        assert_eq!(nearest_source_indices(3, 10), vec![0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
        assert_eq!(nearest_source_indices(3, 7), vec![0, 0, 0, 1, 1, 2, 2]);
        assert_eq!(nearest_source_indices(3, 6), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(nearest_source_indices(4, 4), vec![0, 1, 2, 3]);
    }
}
