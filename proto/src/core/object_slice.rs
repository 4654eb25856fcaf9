//! ObjectSlice and ClusterObjectSlice: overflow storage for the objects of large packages.

use super::common::ObjectSetObject;
use super::resource::{api_kind, Column, KindInfo, AGE_COLUMN};

const OBJECT_SLICE_COLUMNS: &[Column] = &[AGE_COLUMN];

api_kind! {
    /// Objects referenced by name from a phase of an ObjectSet or ObjectDeployment in the same namespace.
    pub struct ObjectSlice {
        pub objects: Vec<ObjectSetObject>,
    }
    scope: NamespaceResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ObjectSlice",
        plural: "objectslices",
        namespaced: true,
        short_names: &["objslice"],
        columns: OBJECT_SLICE_COLUMNS,
        status_default_phase: None,
    },
}

api_kind! {
    /// Objects referenced by name from a phase of a ClusterObjectSet or ClusterObjectDeployment.
    pub struct ClusterObjectSlice {
        pub objects: Vec<ObjectSetObject>,
    }
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ClusterObjectSlice",
        plural: "clusterobjectslices",
        namespaced: false,
        short_names: &["clobjslice"],
        columns: OBJECT_SLICE_COLUMNS,
        status_default_phase: None,
    },
}
