// What Model::Create needs to know of a FeatureSpec's fields (worker/model does not depend on
// worker/data; this is the first layer above both).
#pragma once

#include "worker/data/feature_spec.h"
#include "worker/model/model.h"

namespace pstrain {

// The field count, the DENSE numeric fields, the target-attention fields
// (ListSpec.attention_target) and, when the config names tables, each field's dim and whether it
// stays out of the FM term (its table's fm_join). A spec without named tables leaves field_dims
// and fm_excluded empty: every field has model.embedding_dim, the model of before tables.
inline ModelInputs ModelInputsOf(const FeatureSpec& spec) {
  ModelInputs inputs;
  inputs.num_fields = spec.num_fields();
  inputs.dense_fields = spec.DenseNumericFields();
  for (int f = 0; f < spec.num_fields(); ++f) {
    const FeatureSpec::Field& field = spec.field(f);
    if (field.attention_target >= 0) {
      inputs.attention.push_back({f, field.attention_target, field.attention_hidden});
    }
    if (spec.has_named_tables()) {
      inputs.field_dims.push_back(field.dim);
      inputs.fm_excluded.push_back(field.fm_excluded ? 1 : 0);
    }
  }
  return inputs;
}

}  // namespace pstrain
