//! The label set of the metrics that count reads by where they were read from (`source`), shared by the
//! manager's own read counters and the package image metrics.

use prometheus_client::encoding::EncodeLabelSet;

/// Where something was read from (`source`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    pub(crate) source: &'static str,
}
