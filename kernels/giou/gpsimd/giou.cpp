// GIoU of paired boxes as a Neuron custom C++ operator: the compute (kernel) function,
// run by the GpSimd engine of a NeuronCore-v2 (trn1, inf2), on all of its cores
// (built with multicore=True by kernels/giou/gpsimd_impl.py).
//
// Inputs: two float32 (batch, boxes, 4) tensors (x0, y0, x1, y1); output: the float32
// (batch, boxes) tensor that shape.cpp declares. Seed 004's operator, with three fixes:
// its offsets added each core's first row index unscaled (rows, not elements), so every
// core but core 0 read and wrote the wrong rows; the rows left over when the batch did
// not divide by the core count were never computed; and one TCM buffer was not freed.
//
// Never compiled or run: it needs the GpSimd toolchain and custom-op library
// (aws-neuronx-gpsimd-tools, aws-neuronx-gpsimd-customop-lib) and torch-neuronx.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>

#include <torch/torch.h>
#include <neuron/neuron-utils.hpp>

namespace {

constexpr float kEpsilon = 1e-5f;
constexpr size_t kCoordinates = 4;
// Each core stages a chunk of pairs in its TCM: two input chunks and one output chunk,
// 256 * (4 + 4 + 1) * 4 B = 9 KiB of the 16 KiB pool (no streaming accessor uses the rest).
constexpr size_t kPairsPerChunk = 256;

inline float giou_of_pair(const float* box1, const float* box2) {
  const float area1 = (box1[2] - box1[0]) * (box1[3] - box1[1]);
  const float area2 = (box2[2] - box2[0]) * (box2[3] - box2[1]);
  const float inter_w = std::max(std::min(box1[2], box2[2]) - std::max(box1[0], box2[0]), 0.f);
  const float inter_h = std::max(std::min(box1[3], box2[3]) - std::max(box1[1], box2[1]), 0.f);
  const float inter = inter_w * inter_h;
  const float union_area = area1 + area2 - inter;
  const float iou = inter / std::max(union_area, kEpsilon);
  const float enclosing_w = std::max(std::max(box1[2], box2[2]) - std::min(box1[0], box2[0]), 0.f);
  const float enclosing_h = std::max(std::max(box1[3], box2[3]) - std::min(box1[1], box2[1]), 0.f);
  const float enclosing = std::max(enclosing_w * enclosing_h, kEpsilon);
  return iou - (enclosing - union_area) / enclosing;
}

}  // namespace

torch::Tensor giou_compute(const torch::Tensor& boxes1, const torch::Tensor& boxes2) {
  // Multicore mode: every core writes its own slice of this one output tensor, through
  // TCM accessors only (other accessors race across cores).
  torch::Tensor out = get_dst_tensor();
  const size_t pairs = boxes1.numel() / kCoordinates;

  // Contiguous, near-equal ranges of pairs per core; together they cover every pair.
  const uint64_t core = get_cpu_id();
  const uint64_t cores = get_cpu_count();
  const size_t begin = static_cast<size_t>(pairs * core / cores);
  const size_t end = static_cast<size_t>(pairs * (core + 1) / cores);

  float* staging = static_cast<float*>(
      torch::neuron::tcm_malloc(sizeof(float) * kPairsPerChunk * (2 * kCoordinates + 1)));
  if (staging == nullptr) {
    // Only if something else holds TCM (this buffer is 9 of its 16 KiB). This core's slice
    // is then left unwritten, for the check against the reference to catch before any
    // timing. printf reaches the host from core 0 only.
    if (core == 0) printf("giou_compute: tcm_malloc failed\n");
    return out;
  }
  float* chunk1 = staging;
  float* chunk2 = staging + kPairsPerChunk * kCoordinates;
  float* chunk_out = staging + 2 * kPairsPerChunk * kCoordinates;

  auto boxes1_tcm = boxes1.tcm_accessor();
  auto boxes2_tcm = boxes2.tcm_accessor();
  auto out_tcm = out.tcm_accessor();
  for (size_t first = begin; first < end; first += kPairsPerChunk) {
    const size_t count = std::min(kPairsPerChunk, end - first);
    // Accessor offsets and counts are in elements of the flattened tensor.
    boxes1_tcm.tensor_to_tcm<float>(chunk1, first * kCoordinates, count * kCoordinates);
    boxes2_tcm.tensor_to_tcm<float>(chunk2, first * kCoordinates, count * kCoordinates);
    for (size_t i = 0; i < count; ++i) {
      chunk_out[i] = giou_of_pair(chunk1 + i * kCoordinates, chunk2 + i * kCoordinates);
    }
    out_tcm.tcm_to_tensor<float>(chunk_out, first, count);
  }
  torch::neuron::tcm_free(staging);
  return out;
}
