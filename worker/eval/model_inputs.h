// What Model::Create needs to know of a FeatureSpec's fields (worker/model does not depend on
// worker/data; this is the first layer above both).
#pragma once

#include "worker/data/feature_spec.h"
#include "worker/model/model.h"

namespace pstrain {

// The field count, the DENSE numeric fields and the target-attention fields
// (ListSpec.attention_target).
inline ModelInputs ModelInputsOf(const FeatureSpec& spec) {
  ModelInputs inputs;
  inputs.num_fields = spec.num_fields();
  inputs.dense_fields = spec.DenseNumericFields();
  for (int f = 0; f < spec.num_fields(); ++f) {
    const FeatureSpec::Field& field = spec.field(f);
    if (field.attention_target >= 0) {
      inputs.attention.push_back({f, field.attention_target, field.attention_hidden});
    }
  }
  return inputs;
}

}  // namespace pstrain
