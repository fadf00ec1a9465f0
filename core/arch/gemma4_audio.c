/*
 * gemma4_audio.c - Gemma 4's audio tower blocks (Gemma4AudioModel's `layers`): their weight names.
 * The block itself is Gemma 3n's conformer block with clamped linears and a key scale, computed by
 * the shared forward and backward (conformer.h, formulas at the top of gemma3n_audio.c); the
 * encoder around it (sub-sampling, output projection, embedder) is core/audio/gm_audio_encoder.c.
 *
 * Sources: transformers 5.24's modeling_gemma4.py (Gemma4AudioLayer, Gemma4AudioFeedForward,
 * Gemma4AudioAttention, Gemma4AudioLightConv1d, Gemma4ClippableLinear); gemma_architecture.md §4.6.
 * PEFT names the adapted modules "model.audio_tower.layers.N.self_attn.q_proj.linear", ...: LoRA
 * adapts the inner nn.Linear of each Gemma4ClippableLinear, inside its clamps (a target on the
 * wrapper is refused, as on the vision tower: gm_lora.c). relative_k_proj is not targetable: its
 * output is the relative-position table computed once at load.
 */
#include "conformer.h"

/* lora_id 56..65: a tower adapter's RNG streams differ from the decoder's (0..15), SigLIP's
 * (16..21), Gemma 3n's audio conformer's (32..41) and Gemma 4's vision tower's (48..54). */
#define NORM(hf) {hf, "", GM_W_NORM, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false}
#define LIN(hf, r, c, id) {hf, "", GM_W_LINEAR, r, c, GM_WHEN_ALWAYS, id, false, false}
#define CLIP(m, b) {m "." b, "", GM_W_VEC, GM_DIM_1, GM_DIM_NONE, GM_WHEN_CLIPPED, -1, false, false}
#define CLIPS(m) CLIP(m, "input_min"), CLIP(m, "input_max"), CLIP(m, "output_min"), CLIP(m, "output_max")
static const gm_weight_spec layer_weights[CF_W_COUNT] = {
    [CF_W_F0_PRE] = NORM("feed_forward1.pre_layer_norm.weight"),
    [CF_W_F0_1] = LIN("feed_forward1.ffw_layer_1.linear.weight", GM_DIM_F, GM_DIM_C, 56),
    [CF_W_F0_2] = LIN("feed_forward1.ffw_layer_2.linear.weight", GM_DIM_C, GM_DIM_F, 57),
    [CF_W_F0_POST] = NORM("feed_forward1.post_layer_norm.weight"),
    [CF_W_A_PRE] = NORM("norm_pre_attn.weight"),
    [CF_W_Q] = LIN("self_attn.q_proj.linear.weight", GM_DIM_QW, GM_DIM_C, 58),
    [CF_W_K] = LIN("self_attn.k_proj.linear.weight", GM_DIM_KW, GM_DIM_C, 59),
    [CF_W_V] = LIN("self_attn.v_proj.linear.weight", GM_DIM_KW, GM_DIM_C, 60),
    /* derived at load (gemma3n_audio.c's top comment): the effective query scale, the table */
    [CF_W_QSCALE] = {"self_attn.per_dim_scale", "", GM_W_VEC, GM_DIM_D, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [CF_W_POS] = LIN("self_attn.relative_k_proj.weight", GM_DIM_C, GM_DIM_C, -1),
    [CF_W_POST] = LIN("self_attn.post.linear.weight", GM_DIM_C, GM_DIM_QW, 61),
    [CF_W_A_POST] = NORM("norm_post_attn.weight"),
    [CF_W_L_PRE] = NORM("lconv1d.pre_layer_norm.weight"),
    [CF_W_L_START] = LIN("lconv1d.linear_start.linear.weight", GM_DIM_C2, GM_DIM_C, 62),
    /* (C, 1, K) as stored, read as (C, K) f32 */
    [CF_W_L_CONV] = {"lconv1d.depthwise_conv1d.weight", "", GM_W_VEC, GM_DIM_C, GM_DIM_NONE, GM_WHEN_ALWAYS, -1, false, false},
    [CF_W_L_NORM] = NORM("lconv1d.conv_norm.weight"),
    [CF_W_L_END] = LIN("lconv1d.linear_end.linear.weight", GM_DIM_C, GM_DIM_C, 63),
    [CF_W_F1_PRE] = NORM("feed_forward2.pre_layer_norm.weight"),
    [CF_W_F1_1] = LIN("feed_forward2.ffw_layer_1.linear.weight", GM_DIM_F, GM_DIM_C, 64),
    [CF_W_F1_2] = LIN("feed_forward2.ffw_layer_2.linear.weight", GM_DIM_C, GM_DIM_F, 65),
    [CF_W_F1_POST] = NORM("feed_forward2.post_layer_norm.weight"),
    [CF_W_NORM] = NORM("norm_out.weight"),
    /* the bounds, in conformer.h's order of the clipped linears */
    CLIPS("feed_forward1.ffw_layer_1"), CLIPS("feed_forward1.ffw_layer_2"), CLIPS("self_attn.q_proj"),
    CLIPS("self_attn.k_proj"), CLIPS("self_attn.v_proj"), CLIPS("self_attn.post"), CLIPS("lconv1d.linear_start"),
    CLIPS("lconv1d.linear_end"), CLIPS("feed_forward2.ffw_layer_1"), CLIPS("feed_forward2.ffw_layer_2"),
};

const gm_arch_def gm_arch_gemma4_audio = {
    .id = GM_ARCH_GEMMA4_AUDIO,
    .name = "gemma4_audio",
    .layers_prefix = "layers.",
    .encoder = true,
    .own_attention = true,
    .globals = gm_conformer_globals,
    .n_globals = 3,
    .layer = layer_weights,
    .n_layer = CF_W_COUNT,
    .acts = gm_conformer_acts,
    .n_acts = CF_N_ACTS,
    .grads = gm_conformer_grads,
    .n_grads = CF_N_GRADS,
    .embed_scale = NULL,
    .layer_fwd = gm_conformer_layer_fwd,
    .layer_bwd = gm_conformer_layer_bwd,
};
