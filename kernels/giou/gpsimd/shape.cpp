// GIoU custom C++ operator: the shape function and the operator's registration. Runs on
// the host while torch-neuronx traces the graph: it may read input shapes, never data.
#include <stdint.h>
#include <stdlib.h>

#include <torch/torch.h>
#include "torchneuron/register.h"

// (batch, boxes, 4) x 2 -> (batch, boxes) float32. Same signature as giou_compute.
torch::Tensor giou_shape(torch::Tensor boxes1, torch::Tensor boxes2) {
  return torch::zeros({boxes1.sizes()[0], boxes1.sizes()[1]}, torch::kFloat);
}

// torch.ops.accelsweep.giou: this shape function at trace time, giou_compute on the GpSimd engine.
NEURON_LIBRARY(accelsweep, m) {
  m.def("giou", &giou_shape, "giou_compute");
}
