"""The attention family's figures: the FA-2 setting per mode, memory, FA-1's Figure 3, the gain surface, the
block sweep, the rescaling ablation, decoding, decoding a batch of paged requests, variable-length batches, the
FA-3 ladder and ablation; and,
when the report holds several GPU types, those side by side (``COMPARISON``).

Each is drawn from the attention table (``fa2_figures``, ``experiment_figures``, ``fa3_figures``); its caption
is ``captions/<name>.rst`` of this folder and its section one of the family's report sections.
"""

from __future__ import annotations

from analysis.core.family import Figure
from analysis.families.attention import experiment_figures as ex
from analysis.families.attention import fa2_figures as fa2
from analysis.families.attention import fa3_figures as fa3
from analysis.families.attention import serving_figures as serving

# name -> figure, in the order the report shows them within each section
FIGURES = {
    "attention_tflops": Figure(fa2.attention_tflops, "fa2-setting"),
    "attention_speedup": Figure(fa2.attention_speedup, "fa2-setting"),
    "attention_tflops_bwd": Figure(fa2.attention_tflops_bwd, "fa2-setting"),
    "attention_tflops_fwd_bwd": Figure(fa2.attention_tflops_fwd_bwd, "fa2-setting"),
    "attention_memory": Figure(fa2.attention_memory, "memory"),
    "attention_memory_fwd_bwd": Figure(fa2.attention_memory_fwd_bwd, "memory"),
    "fa1_figure3": Figure(ex.fa1_figure3, "fa1-setting"),
    "gain_surface": Figure(ex.gain_surface, "gain-surface"),
    "block_sweep": Figure(ex.block_sweep, "block-sweep"),
    "rescale_ablation": Figure(ex.rescale_ablation, "rescale-ablation"),
    "decode_latency": Figure(ex.decode_latency, "decode"),
    "decode_serving": Figure(serving.decode_serving, "decode-serving"),
    "varlen_padding": Figure(ex.varlen_padding, "varlen"),
    "fa3_ladder": Figure(fa3.fa3_ladder, "fa2-setting"),
    "fa3_ablation": Figure(fa3.fa3_ablation, "fa3-ablation"),
}
# drawn over every GPU type's table at once, when the report holds several
COMPARISON = {"gpu_comparison": Figure(fa2.gpu_comparison)}
