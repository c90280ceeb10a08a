//! The keyword arguments the diffusers mid blocks share, declared once.
//!
//! `UNetMidBlock2D`, `UNetMidBlock2DCrossAttn`, `UNetMidBlock2DSimpleCrossAttn`,
//! `UNetMidBlock3DCrossAttn` and `UNetMidBlockCrossAttnMotion` (diffusers 0.42.1) all take the
//! resnet kwargs of [`ResnetKwargs`] with the same defaults; `UNetMidBlock2DCrossAttn` and
//! `UNetMidBlockCrossAttnMotion` also take the transformer kwargs of [`TransformerKwargs`].
//! (`UNetMidBlock3DCrossAttn` takes a subset of those with another `use_linear_projection`
//! default and another meaning of `num_attention_heads`, so it declares its own.)
//!
//! # Why a macro and not `#[serde(flatten)]`
//!
//! The configs must stay flat (the bundles store the PyTorch kwargs as they are, and
//! `Serialize` writes them back the same way), refuse unknown keys naming the block and the key,
//! and keep the fields users set (`cfg.resnet_groups = Some(4)`). A `#[serde(flatten)]`ed
//! sub-struct cannot be combined with `deny_unknown_fields` (serde then accepts any key) and
//! would move the fields (`cfg.resnet.resnet_groups`). So [`mid_block_config!`] declares each
//! mid-block config as one flat struct with `deny_unknown_fields`: the block's own fields as
//! written, the shared ones appended from one declaration here (docs, serde defaults and the
//! Rust defaults of `new` together), and accessors returning the typed sub-configs
//! ([`ResnetKwargs`], [`TransformerKwargs`]) that the constructors build from.

use super::LayersPerBlock;
use crate::config::defaults;
use crate::diffusers::resnet::{swish, ResnetBlock2DConfig, TimeEmbeddingNorm};
use crate::diffusers::transformers::transformer::{AttentionType, Transformer2DModelConfig};
use crate::layers::Activation;
use crate::{Error, Result};
use serde::Deserialize;

/// `resnet_time_scale_shift`: how `temb` enters the mid block's resnets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case", try_from = "String")]
pub enum TimeScaleShift {
    /// Added after `conv1` (`ResnetBlock2D(time_embedding_norm="default")`).
    #[default]
    Default,
    /// FiLM after `norm2` (`time_embedding_norm="scale_shift"`).
    ScaleShift,
    /// `ResnetBlockCondNorm2D` with `SpatialNorm` (MoVQ's decoder; `UNetMidBlock2D` only).
    Spatial,
    /// `ResnetBlockCondNorm2D` with `AdaGroupNorm` (not ported).
    AdaGroup,
}

impl TimeScaleShift {
    /// The name diffusers uses.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeScaleShift::Default => "default",
            TimeScaleShift::ScaleShift => "scale_shift",
            TimeScaleShift::Spatial => "spatial",
            TimeScaleShift::AdaGroup => "ada_group",
        }
    }

    /// The `time_embedding_norm` of the `ResnetBlock2D`s a mid block builds with this. `"spatial"`
    /// and `"ada_group"` reach `ResnetBlock2D`, which diffusers refuses for them (only
    /// `UNetMidBlock2D` builds `ResnetBlockCondNorm2D`, and only for `"spatial"`).
    pub(crate) fn time_norm(self, block: &'static str) -> Result<TimeEmbeddingNorm> {
        match self {
            TimeScaleShift::Default => Ok(TimeEmbeddingNorm::Default),
            TimeScaleShift::ScaleShift => Ok(TimeEmbeddingNorm::ScaleShift),
            TimeScaleShift::Spatial | TimeScaleShift::AdaGroup => {
                let name = self.as_str();
                Err(Error::config(
                    block,
                    format!(
                        "resnet_time_scale_shift {name:?} makes this block build ResnetBlock2D(time_embedding_norm={name:?}), \
                         which diffusers refuses (\"please use ResnetBlockCondNorm2D\"); only UNetMidBlock2D takes \"spatial\""
                    ),
                ))
            }
        }
    }
}

impl TryFrom<String> for TimeScaleShift {
    type Error = String;

    fn try_from(name: String) -> std::result::Result<Self, String> {
        let all = [
            TimeScaleShift::Default,
            TimeScaleShift::ScaleShift,
            TimeScaleShift::Spatial,
            TimeScaleShift::AdaGroup,
        ];
        all.into_iter().find(|s| s.as_str() == name).ok_or_else(|| {
            format!(
                "unknown resnet_time_scale_shift {name:?}; expected \"default\", \"scale_shift\", \"spatial\" or \"ada_group\""
            )
        })
    }
}

/// The resnet kwargs of the diffusers mid blocks, as a typed sub-config (the flat fields of a
/// mid-block config, read by its `resnet_kwargs()`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResnetKwargs {
    /// `dropout` (identity in eval mode).
    pub dropout: f64,
    /// `resnet_eps`.
    pub resnet_eps: f64,
    /// `resnet_time_scale_shift`.
    pub resnet_time_scale_shift: TimeScaleShift,
    /// `resnet_act_fn`.
    pub resnet_act_fn: Activation,
    /// `resnet_groups` (`None`: `min(in_channels // 4, 32)`).
    pub resnet_groups: Option<usize>,
    /// `resnet_pre_norm` (ignored by diffusers' resnets).
    pub resnet_pre_norm: bool,
    /// `output_scale_factor`.
    pub output_scale_factor: f64,
}

impl Default for ResnetKwargs {
    /// diffusers' defaults: `dropout=0.0, resnet_eps=1e-6, resnet_time_scale_shift="default",
    /// resnet_act_fn="swish", resnet_groups=32, resnet_pre_norm=True, output_scale_factor=1.0`.
    fn default() -> Self {
        Self {
            dropout: 0.0,
            resnet_eps: defaults::eps_1e6(),
            resnet_time_scale_shift: TimeScaleShift::default(),
            resnet_act_fn: swish(),
            resnet_groups: defaults::some::<32>(),
            resnet_pre_norm: defaults::yes(),
            output_scale_factor: defaults::one_f(),
        }
    }
}

impl ResnetKwargs {
    /// `resnet_groups`, or diffusers' `min(in_channels // 4, 32)` for `None`.
    pub fn groups(&self, in_channels: usize) -> usize {
        self.resnet_groups.unwrap_or((in_channels / 4).min(32))
    }

    /// The `ResnetBlock2D(in_channels, out_channels, temb_channels, groups, groups_out, eps,
    /// non_linearity, time_embedding_norm, dropout, output_scale_factor, pre_norm)` the mid
    /// blocks build; `block` names the mid block in the error for a time norm
    /// `ResnetBlock2D` refuses.
    pub(crate) fn resnet(
        &self,
        block: &'static str,
        (in_channels, out_channels): (usize, usize),
        temb_channels: Option<usize>,
        (groups, groups_out): (usize, Option<usize>),
    ) -> Result<ResnetBlock2DConfig> {
        Ok(ResnetBlock2DConfig {
            out_channels: Some(out_channels),
            dropout: self.dropout,
            temb_channels,
            groups,
            groups_out,
            pre_norm: self.resnet_pre_norm,
            eps: self.resnet_eps,
            non_linearity: self.resnet_act_fn,
            time_embedding_norm: self.resnet_time_scale_shift.time_norm(block)?,
            output_scale_factor: self.output_scale_factor,
            ..ResnetBlock2DConfig::new(in_channels)
        })
    }
}

/// The transformer kwargs of `UNetMidBlock2DCrossAttn` and `UNetMidBlockCrossAttnMotion`, as a
/// typed sub-config (read by the config's `transformer_kwargs()`).
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerKwargs {
    /// `transformer_layers_per_block`.
    pub transformer_layers_per_block: LayersPerBlock,
    /// `num_attention_heads`: the head count (width `channels / num_attention_heads`).
    pub num_attention_heads: usize,
    /// `cross_attention_dim`.
    pub cross_attention_dim: usize,
    /// `dual_cross_attention`.
    pub dual_cross_attention: bool,
    /// `use_linear_projection`.
    pub use_linear_projection: bool,
    /// `upcast_attention`.
    pub upcast_attention: bool,
    /// `attention_type`.
    pub attention_type: AttentionType,
}

impl Default for TransformerKwargs {
    /// diffusers' defaults: `transformer_layers_per_block=1, num_attention_heads=1,
    /// cross_attention_dim=1280, dual_cross_attention=False, use_linear_projection=False,
    /// upcast_attention=False, attention_type="default"`.
    fn default() -> Self {
        Self {
            transformer_layers_per_block: LayersPerBlock::default(),
            num_attention_heads: defaults::usize::<1>(),
            cross_attention_dim: defaults::usize::<1280>(),
            dual_cross_attention: false,
            use_linear_projection: false,
            upcast_attention: false,
            attention_type: AttentionType::default(),
        }
    }
}

impl TransformerKwargs {
    /// The `Transformer2DModel(num_attention_heads, in_channels // num_attention_heads,
    /// in_channels=channels, num_layers, cross_attention_dim, norm_num_groups, use_linear_projection,
    /// upcast_attention, attention_type)` of one layer.
    pub(crate) fn transformer(
        &self,
        (channels, head_dim): (usize, usize),
        num_layers: usize,
        norm_num_groups: usize,
    ) -> Transformer2DModelConfig {
        Transformer2DModelConfig {
            num_attention_heads: self.num_attention_heads,
            attention_head_dim: head_dim,
            in_channels: Some(channels),
            num_layers,
            cross_attention_dim: Some(self.cross_attention_dim),
            norm_num_groups,
            use_linear_projection: self.use_linear_projection,
            upcast_attention: self.upcast_attention,
            attention_type: self.attention_type,
            ..Transformer2DModelConfig::default()
        }
    }
}

/// Declares a diffusers mid-block config: one flat struct (`deny_unknown_fields`) with the
/// required fields (in brackets), the block's own fields with their defaults, and the shared kwargs named
/// after `with` appended from their one declaration here; `new(required...)` with every other
/// field at its default, and `resnet_kwargs()` / `transformer_kwargs()`.
///
/// ```ignore
/// mid_block_config! {
///     /// Keyword arguments of `Block(in_channels, temb_channels, num_layers=1)`.
///     pub struct BlockConfig {
///         [
///             /// Channels in and out.
///             pub in_channels: usize,
///             pub temb_channels: Option<usize>,
///         ]
///         #[serde(default = "defaults::usize::<1>")]
///         pub num_layers: usize = defaults::usize::<1>(),
///     }
///     with [resnet, transformer]
/// }
/// ```
///
/// Each own field's default is written twice, in `#[serde(default)]` and after `=`; the
/// config's `new_matches_serde_defaults` test checks that the two agree.
macro_rules! mid_block_config {
    // The transformer kwargs, appended to the own fields; then the resnet kwargs.
    (
        $(#[$meta:meta])* pub struct $name:ident { [$($required:tt)*] $($own:tt)* }
        with [resnet, transformer]
    ) => {
        $crate::diffusers::unets::mid_block::mid_block_config! {
            $(#[$meta])* pub struct $name { [$($required)*] $($own)*
                /// Transformer blocks per `Transformer2DModel`: one count, or one per layer.
                #[serde(default)]
                pub transformer_layers_per_block: $crate::diffusers::unets::mid_block::LayersPerBlock =
                    $crate::diffusers::unets::mid_block::LayersPerBlock::default(),
                /// Attention heads of each transformer (head width `in_channels / num_attention_heads`;
                /// SD's `attention_head_dim: 8` means 8 heads).
                #[serde(default = "crate::config::defaults::usize::<1>")]
                pub num_attention_heads: usize = $crate::config::defaults::usize::<1>(),
                /// Width of `encoder_hidden_states` (CLIP ViT-L: 768, SD 2.x: 1024, SDXL: 2048).
                #[serde(default = "crate::config::defaults::usize::<1280>")]
                pub cross_attention_dim: usize = $crate::config::defaults::usize::<1280>(),
                /// Versatile Diffusion's two transformers per layer (`DualTransformer2DModel`).
                #[serde(default)]
                pub dual_cross_attention: bool = false,
                /// Linear `proj_in`/`proj_out` (SD 2.x, XL) instead of 1×1 convolutions (SD 1.x).
                #[serde(default)]
                pub use_linear_projection: bool = false,
                /// Attention scores in f32 in half-precision runs (SD 2.1).
                #[serde(default)]
                pub upcast_attention: bool = false,
                /// `default` only (`gated` adapters are not supported).
                #[serde(default)]
                pub attention_type: $crate::diffusers::transformers::transformer::AttentionType =
                    $crate::diffusers::transformers::transformer::AttentionType::Default,
            }
            with [resnet]
        }

        impl $name {
            /// The transformer kwargs as their typed sub-config.
            pub fn transformer_kwargs(&self) -> $crate::diffusers::unets::mid_block::TransformerKwargs {
                $crate::diffusers::unets::mid_block::TransformerKwargs {
                    transformer_layers_per_block: self.transformer_layers_per_block.clone(),
                    num_attention_heads: self.num_attention_heads,
                    cross_attention_dim: self.cross_attention_dim,
                    dual_cross_attention: self.dual_cross_attention,
                    use_linear_projection: self.use_linear_projection,
                    upcast_attention: self.upcast_attention,
                    attention_type: self.attention_type,
                }
            }
        }
    };
    // The resnet kwargs, appended to the own fields.
    (
        $(#[$meta:meta])* pub struct $name:ident { [$($required:tt)*] $($own:tt)* }
        with [resnet]
    ) => {
        $crate::diffusers::unets::mid_block::mid_block_config! {
            @emit $(#[$meta])* pub struct $name { [$($required)*] $($own)*
                /// Dropout probability of the resnets (inactive in inference; kept for the kwargs).
                #[serde(default)]
                pub dropout: f64 = 0.0,
                /// GroupNorm eps of the resnets: the model's `norm_eps` (SD U-Nets 1e-5; VAEs 1e-6,
                /// the class default).
                #[serde(default = "crate::config::defaults::eps_1e6")]
                pub resnet_eps: f64 = $crate::config::defaults::eps_1e6(),
                /// How `temb` enters the resnets: `default` (added), `scale_shift` (FiLM); `spatial`
                /// (MoVQ's decoder) only in `UNetMidBlock2D`.
                #[serde(default)]
                pub resnet_time_scale_shift: $crate::diffusers::unets::mid_block::TimeScaleShift =
                    $crate::diffusers::unets::mid_block::TimeScaleShift::Default,
                /// The resnets' activation (`swish` = `silu`, `mish`, `gelu`).
                #[serde(default = "crate::diffusers::resnet::swish")]
                pub resnet_act_fn: $crate::layers::Activation = $crate::diffusers::resnet::swish(),
                /// GroupNorm groups of the resnets (and of the block's other norms);
                /// `null`: `min(in_channels // 4, 32)`.
                #[serde(default = "crate::config::defaults::some::<32>")]
                pub resnet_groups: Option<usize> = $crate::config::defaults::some::<32>(),
                /// Always true in diffusers' resnets (kept for the kwargs).
                #[serde(default = "crate::config::defaults::yes")]
                pub resnet_pre_norm: bool = $crate::config::defaults::yes(),
                /// Each resnet's output is divided by this (`mid_block_scale_factor`).
                #[serde(default = "crate::config::defaults::one_f")]
                pub output_scale_factor: f64 = $crate::config::defaults::one_f(),
            }
        }

        impl $name {
            /// The resnet kwargs as their typed sub-config.
            pub fn resnet_kwargs(&self) -> $crate::diffusers::unets::mid_block::ResnetKwargs {
                $crate::diffusers::unets::mid_block::ResnetKwargs {
                    dropout: self.dropout,
                    resnet_eps: self.resnet_eps,
                    resnet_time_scale_shift: self.resnet_time_scale_shift,
                    resnet_act_fn: self.resnet_act_fn,
                    resnet_groups: self.resnet_groups,
                    resnet_pre_norm: self.resnet_pre_norm,
                    output_scale_factor: self.output_scale_factor,
                }
            }
        }
    };
    // The struct and `new`.
    (
        @emit $(#[$meta:meta])* pub struct $name:ident {
            [$( $(#[$rmeta:meta])* pub $required:ident: $rty:ty, )*]
            $( $(#[$fmeta:meta])* pub $field:ident: $fty:ty = $default:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $( $(#[$rmeta])* pub $required: $rty, )*
            $( $(#[$fmeta])* pub $field: $fty, )*
        }

        impl $name {
            /// The PyTorch constructor with its required arguments, every other field at
            /// diffusers' default; change fields after, or with struct-update syntax
            /// (`Config { num_layers: 2, ..Config::new(..) }`).
            pub fn new($($required: $rty),*) -> Self {
                Self {
                    $( $required, )*
                    $( $field: $default, )*
                }
            }
        }
    };
}
pub(crate) use mid_block_config;
