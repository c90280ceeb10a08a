"""The ``parity.source`` phrases of the attention bundles (which library class, or which published
code a re-stated class copies) and the diffusers VAE mid-block attention config several specs share."""

# marker in parity.source telling the published SD 2.x classes from the SD 1.x re-statements (same
# kwargs for ldm.CrossAttention)
SD2_MARK = "Stability-AI/stablediffusion"

LUCID = "real library class denoising_diffusion_pytorch.denoising_diffusion_pytorch.{}"
AD_SRC = ("re-statement scripts/reference/annotated_diffusion.py of huggingface/blog annotated-diffusion.md "
          "(commit fd0b6566b04f) {}")
LDM_SRC = ("re-statement scripts/reference/ldm.py of CompVis/latent-diffusion ldm/modules/attention.py "
           "(commit a506df575647) LinearAttention{}")
FASTAI_SRC = "re-statement scripts/reference/fastai.py of fastai/course22p2 nbs/27_attention.ipynb (commit df9323235bc3) {}"
TEXTBOOK_SRC = "re-statement scripts/reference/textbook.py of the seed-003 textbook notes {}"
DIFF_SRC = "real library class diffusers.models.attention_processor.Attention"
DIFF_FF_SRC = "real library class diffusers.models.attention.{}"
DIFF_ACT_SRC = "real library class diffusers.models.activations.{}"
DIFF_T2D_SRC = "real library class diffusers.models.transformers.transformer_2d.Transformer2DModel"
SD1_SRC = ("re-statement scripts/reference/ldm_sd1.py of CompVis/latent-diffusion ldm/modules/attention.py "
           "(commit a506df575647 = CompVis/stable-diffusion 21f890f9da3c, SD 1.x; no package ships the SD 1.x tree) {}")
SDKIT = "as shipped by stable-diffusion-sdkit"
SD2_SRC = "published class ldm.modules.attention.{} of " + SD2_MARK + " (SD 2.x ldm tree, " + SDKIT + ")"
LDM_MODEL_SRC = ("published class ldm.modules.diffusionmodules.model.{} of " + SD2_MARK + " (SD 2.x ldm tree, " +
                 SDKIT + "; unchanged from CompVis/latent-diffusion)")
LIN_ATTN_SRC = ("re-statement scripts/reference/ldm.py of CompVis/latent-diffusion ldm/modules/diffusionmodules/model.py "
                "(commit a506df575647) LinAttnBlock (= LinearAttention(dim=C, heads=1, dim_head=C); the SD 2.x tree "
                "dropped it)")
OPENAI_SRC = ("published class guided_diffusion.unet.AttentionBlock of openai/guided-diffusion "
              "(as shipped by guided-diffusion-sdk){}")

VAE_MID = dict(query_dim=32, heads=1, dim_head=32, rescale_output_factor=1.0, eps=1e-6, norm_num_groups=8,
               spatial_norm_dim=None, residual_connection=True, bias=True, upcast_softmax=True,
               _from_deprecated_attn_block=True)
