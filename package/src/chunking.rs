//! Chunking a package's objects into ObjectSlices, so that an ObjectDeployment and its ObjectSets stay far
//! below etcd's object size limit (~1.5 MiB) for big packages. The Package annotation
//! `packages.package-operator.run/chunking-strategy` picks the strategy:
//! - `NoOp`: objects stay inline in the deployment's template;
//! - `EachObject`: one slice per object;
//! - `BinpackNextFit`: objects of a phase, in order, fill a slice until the next one would pass 1 MiB.
//!
//! Without the annotation objects stay inline, unless they add up to more than 1 MiB: then they are
//! binpacked, where Package Operator would fail to store the deployment. Slices are named by content
//! (`<deployment>-<hash>`), so an unchanged slice keeps its name across revisions and a changed one is new.
//!
//! Pure: phases in, phases referencing slices plus the slices out.

use pko_proto::core::common::{ObjectSetObject, ObjectSetTemplatePhase};

use crate::canonical_hash::value_hash;
use pko_proto::well_known::CHUNKING_ANNOTATION;

/// Bin size of BinpackNextFit, and the inline size above which packages without the annotation are
/// binpacked.
pub const MAX_SLICE_BYTES: usize = 1024 * 1024;

/// How objects are put into slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkingStrategy {
    NoOp,
    EachObject,
    BinpackNextFit,
}

impl ChunkingStrategy {
    /// The strategy the annotation names (None: no annotation).
    pub fn from_annotation(value: Option<&str>) -> Result<Option<Self>, String> {
        match value {
            None => Ok(None),
            Some("NoOp") => Ok(Some(Self::NoOp)),
            Some("EachObject") => Ok(Some(Self::EachObject)),
            Some("BinpackNextFit") => Ok(Some(Self::BinpackNextFit)),
            Some(other) => Err(format!(
                "annotation {CHUNKING_ANNOTATION}: {other:?} is not NoOp, EachObject or BinpackNextFit"
            )),
        }
    }
}

/// One slice to store.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub name: String,
    pub objects: Vec<ObjectSetObject>,
}

fn size_of(object: &ObjectSetObject) -> usize {
    serde_json::to_vec(object).map_or(0, |b| b.len())
}

fn bins(objects: Vec<ObjectSetObject>, strategy: ChunkingStrategy) -> Vec<Vec<ObjectSetObject>> {
    match strategy {
        ChunkingStrategy::NoOp => vec![objects],
        ChunkingStrategy::EachObject => objects.into_iter().map(|o| vec![o]).collect(),
        ChunkingStrategy::BinpackNextFit => {
            let mut bins: Vec<Vec<ObjectSetObject>> = Vec::new();
            let mut filled = 0;
            for object in objects {
                let size = size_of(&object);
                match bins.last_mut() {
                    Some(bin) if filled + size <= MAX_SLICE_BYTES => bin.push(object),
                    _ => {
                        bins.push(vec![object]);
                        filled = 0;
                    }
                }
                filled += size;
            }
            bins
        }
    }
}

fn slice_name(deployment: &str, phase: &str, objects: &[ObjectSetObject]) -> String {
    let content = serde_json::json!({ "phase": phase, "objects": objects });
    // A deployment name is at most 253 characters; keep room for the suffix.
    let prefix: String = deployment.chars().take(253 - 17).collect();
    format!("{prefix}-{:016x}", value_hash(&content))
}

/// Cuts `phases` into slices for `deployment`. With `NoOp` (or no annotation and a small package) the
/// phases come back unchanged and there are no slices.
pub fn chunk(
    deployment: &str,
    phases: Vec<ObjectSetTemplatePhase>,
    strategy: Option<ChunkingStrategy>,
) -> (Vec<ObjectSetTemplatePhase>, Vec<Slice>) {
    let strategy = strategy.unwrap_or_else(|| {
        let inline: usize = phases.iter().flat_map(|p| &p.objects).map(size_of).sum();
        if inline > MAX_SLICE_BYTES {
            ChunkingStrategy::BinpackNextFit
        } else {
            ChunkingStrategy::NoOp
        }
    });
    if strategy == ChunkingStrategy::NoOp {
        return (phases, Vec::new());
    }
    let mut slices = Vec::new();
    let phases = phases
        .into_iter()
        .map(|mut phase| {
            let objects = std::mem::take(&mut phase.objects);
            if !objects.is_empty() {
                for bin in bins(objects, strategy) {
                    let name = slice_name(deployment, &phase.name, &bin);
                    phase.slices.push(name.clone());
                    slices.push(Slice { name, objects: bin });
                }
            }
            phase
        })
        .collect();
    (phases, slices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn object(name: &str, payload: usize) -> ObjectSetObject {
        ObjectSetObject {
            object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                           "data": {"payload": "x".repeat(payload)}}),
            ..Default::default()
        }
    }

    fn phase(name: &str, objects: Vec<ObjectSetObject>) -> ObjectSetTemplatePhase {
        ObjectSetTemplatePhase {
            name: name.to_owned(),
            objects,
            ..Default::default()
        }
    }

    #[test]
    fn annotation_values() {
        assert_eq!(ChunkingStrategy::from_annotation(None), Ok(None));
        assert_eq!(
            ChunkingStrategy::from_annotation(Some("EachObject")),
            Ok(Some(ChunkingStrategy::EachObject))
        );
        assert!(ChunkingStrategy::from_annotation(Some("eachobject"))
            .unwrap_err()
            .contains("is not NoOp, EachObject or BinpackNextFit"));
    }

    #[test]
    fn small_packages_stay_inline_and_big_ones_are_binpacked() {
        let small = vec![phase("a", vec![object("x", 10)])];
        let (phases, slices) = chunk("od", small.clone(), None);
        assert_eq!((phases, slices.len()), (small, 0));

        let big = vec![phase(
            "a",
            (0..5)
                .map(|i| object(&format!("o{i}"), 400 * 1024))
                .collect(),
        )];
        let (phases, slices) = chunk("od", big, None);
        assert!(phases[0].objects.is_empty());
        assert_eq!(
            slices.len(),
            3,
            "two 400 KiB objects fit 1 MiB, three do not"
        );
        assert_eq!(
            phases[0].slices,
            slices.iter().map(|s| s.name.clone()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn each_object_gets_a_slice_named_by_content() {
        let phases = vec![
            phase("a", vec![object("x", 1), object("y", 1)]),
            phase("b", vec![]),
        ];
        let (out, slices) = chunk("od", phases.clone(), Some(ChunkingStrategy::EachObject));
        assert_eq!(slices.len(), 2);
        assert!(out[1].slices.is_empty());
        assert!(slices[0].name.starts_with("od-"));
        let (_, again) = chunk("od", phases, Some(ChunkingStrategy::EachObject));
        assert_eq!(slices, again, "same content, same names");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Every object lands in exactly one slice, in order; no slice but a single oversized object
        /// passes the bin size.
        #[test]
        fn binpacking_keeps_every_object_once_in_order(sizes in proptest::collection::vec(0usize..600_000, 0..8)) {
            let objects: Vec<ObjectSetObject> = sizes.iter().enumerate().map(|(i, s)| object(&format!("o{i}"), *s)).collect();
            let (out, slices) = chunk("od", vec![phase("p", objects.clone())], Some(ChunkingStrategy::BinpackNextFit));
            let flattened: Vec<ObjectSetObject> = slices.iter().flat_map(|s| s.objects.clone()).collect();
            prop_assert_eq!(flattened, objects);
            prop_assert_eq!(out[0].slices.len(), slices.len());
            for slice in &slices {
                let total: usize = slice.objects.iter().map(size_of).sum();
                prop_assert!(total <= MAX_SLICE_BYTES || slice.objects.len() == 1);
            }
        }
    }
}
