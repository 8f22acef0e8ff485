// The validation split of the train channels (data.validation_fraction): which records are held
// out of training to feed the periodic evaluations. A record belongs to the validation split when
// a hash of its bytes, mapped to [0, 1), is below the fraction. The decision depends on the
// record's content only, so it is the same on every reader, in every epoch, under any shuffle or
// sharding, and across a resume; duplicate records fall on the same side (no leak of a training
// record into the validation split). Trailing line ends are not hashed, so a text file with CRLF
// line ends splits as its LF copy does.
#pragma once

#include "absl/strings/string_view.h"

namespace pstrain {

// `fraction` in [0, 1); 0: no record is held out.
bool InValidationSplit(absl::string_view record, double fraction);

}  // namespace pstrain
