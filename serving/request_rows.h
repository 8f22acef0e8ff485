// The rows of a Predict request (proto/pstrain/serving.proto) as RawRows for a model's
// FeatureSpec: raw Criteo-shaped text rows (TSV or CSV, with or without the label) or feature
// lists by name. A list field (FieldSpec.list) takes a list as a CSV list column writes it
// ("a|b:0.5|c", the field's separator), in a text row's column or an example's `text`, parsed by
// the CSV reader's own ParseListText; an example's `key` or whole `number` is a list of one id.
// Every value is hostile: a wrong field count, a number that does not parse or is not finite, a
// bad hex key, an unknown or repeated field name, a key given for a numeric field, an over-long
// list under REFUSE, an empty list item or a bad weight, all are INVALID_ARGUMENT naming the row
// (its index in the request, from 0), the field (index and name) and what was expected. Nothing
// is accepted half: on error *rows is unspecified.
//
// Thread-safety: a pure function.
#pragma once

#include "absl/status/status.h"
#include "pstrain/serving.pb.h"
#include "worker/data/batch.h"
#include "worker/data/feature_spec.h"

namespace pstrain {

// The request's own fields, whatever its rows: an enum value this server does not know (a
// newer client's, or garbage: proto3 keeps unknown enum values as numbers) is INVALID_ARGUMENT
// naming the field and the values it takes, e.g. "row_format 7: expected TSV (0) or CSV (1)".
absl::Status CheckRequestFields(const PredictRequest& request);

// Appends the request's rows (or examples) to *rows (rows->num_fields must be spec's, or rows
// empty). INVALID_ARGUMENT as above; also when the request carries both rows and examples, and
// for CheckRequestFields' errors.
absl::Status ParseRequestRows(const PredictRequest& request, const FeatureSpec& spec,
                              RawRows* rows);

}  // namespace pstrain
