//! How a Rust struct becomes a Kubernetes kind: `apiVersion`/`kind` on the wire, `kube::Resource`, and the
//! CRD built from the struct's own schema.
//!
//! A macro instead of `kube`'s derive because Package Operator shares one spec type between a namespaced
//! kind and its Cluster twin (`Package` and `ClusterPackage` both carry `PackageSpec`), and because
//! ObjectSlice keeps its objects at the top level rather than under `spec`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresourceStatus,
    CustomResourceSubresources, CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};
use serde_json::{json, Map, Value};

/// Static facts about a kind that its CRD needs beyond the schema.
#[derive(Clone, Copy, Debug)]
pub struct KindInfo {
    /// API group.
    pub group: &'static str,
    /// Kind, e.g. `ObjectSet`.
    pub kind: &'static str,
    /// Plural resource name, e.g. `objectsets`.
    pub plural: &'static str,
    /// Whether objects of this kind live in a namespace.
    pub namespaced: bool,
    /// `kubectl get` short names.
    pub short_names: &'static [&'static str],
    /// `kubectl get` printer columns.
    pub columns: &'static [Column],
    /// Default for `.status` (Package Operator defaults some to `{phase: Pending}`).
    pub status_default_phase: Option<&'static str>,
}

/// One `kubectl get` printer column.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    /// Header.
    pub name: &'static str,
    /// OpenAPI type: `string`, `integer`, `date`.
    pub type_: &'static str,
    /// JSONPath into the object.
    pub json_path: &'static str,
    /// 0 shows in the default view, 1 only with `-o wide`.
    pub priority: i32,
}

/// A package-operator.run kind: its facts and the schemas of its top-level fields.
pub trait ApiKind: kube::Resource<DynamicType = ()> {
    /// Static facts.
    const INFO: KindInfo;
    /// `(field name, schema)` of each top-level field besides apiVersion, kind and metadata.
    fn field_schemas() -> Vec<(&'static str, Schema)>;
}

/// The generator kube-derive uses, so our schemas obey the same structural rules.
pub(crate) fn schema_for<T: JsonSchema>() -> Schema {
    let generator = SchemaSettings::openapi3()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .with_transform(schemars::transform::AddNullable::default())
        .with_transform(kube::core::schema::StructuralSchemaRewriter)
        .with_transform(kube::core::schema::OptionalEnum)
        .with_transform(kube::core::schema::OptionalIntOrString)
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>();
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        object.remove("$schema");
    }
    schema
}

/// Errors building a CRD from a kind's schema.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The generated schema is not a valid `JSONSchemaProps` (a bug in a type's schema attributes).
    #[error("schema of {kind} is not valid JSONSchemaProps: {source}")]
    Schema {
        /// The kind.
        kind: &'static str,
        /// What serde reported.
        source: serde_json::Error,
    },
}

/// Builds the CustomResourceDefinition of a kind.
pub fn crd_for<K: ApiKind>() -> Result<CustomResourceDefinition, CrdError> {
    let info = K::INFO;
    let mut properties = Map::new();
    properties.insert("apiVersion".into(), json!({"type": "string"}));
    properties.insert("kind".into(), json!({"type": "string"}));
    properties.insert("metadata".into(), json!({"type": "object"}));
    let mut has_status = false;
    for (name, schema) in K::field_schemas() {
        let mut value = schema.to_value();
        if name == "status" {
            has_status = true;
            if let (Some(phase), Some(object)) = (info.status_default_phase, value.as_object_mut())
            {
                object.insert("default".into(), json!({ "phase": phase }));
            }
        }
        properties.insert(name.into(), value);
    }
    let mut root = json!({ "type": "object", "properties": Value::Object(properties) });
    if K::field_schemas()
        .iter()
        .any(|(name, _)| *name == "objects")
    {
        // ObjectSlices exist only to carry objects, fixed at creation (upstream's rule).
        root["required"] = json!(["objects"]);
        root["properties"]["objects"]["x-kubernetes-validations"] =
            json!([{"rule": "self == oldSelf", "message": "objects is immutable"}]);
    }
    let schema: JSONSchemaProps =
        serde_json::from_value(root).map_err(|source| CrdError::Schema {
            kind: info.kind,
            source,
        })?;

    let columns = info
        .columns
        .iter()
        .map(|column| CustomResourceColumnDefinition {
            name: column.name.into(),
            type_: column.type_.into(),
            json_path: column.json_path.into(),
            priority: (column.priority != 0).then_some(column.priority),
            ..Default::default()
        })
        .collect::<Vec<_>>();

    Ok(CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", info.plural, info.group)),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: info.group.into(),
            names: CustomResourceDefinitionNames {
                kind: info.kind.into(),
                list_kind: Some(format!("{}List", info.kind)),
                plural: info.plural.into(),
                singular: Some(info.kind.to_ascii_lowercase()),
                short_names: (!info.short_names.is_empty())
                    .then(|| info.short_names.iter().map(|s| (*s).to_owned()).collect()),
                categories: Some(vec!["pko".into()]),
            },
            scope: if info.namespaced {
                "Namespaced"
            } else {
                "Cluster"
            }
            .into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: crate::VERSION.into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                subresources: has_status.then(|| CustomResourceSubresources {
                    status: Some(CustomResourceSubresourceStatus(json!({}))),
                    scale: None,
                }),
                additional_printer_columns: (!columns.is_empty()).then_some(columns),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    })
}

/// Shorthand for a condition-status printer column.
pub(crate) const fn condition_column(name: &'static str, json_path: &'static str) -> Column {
    Column {
        name,
        type_: "string",
        json_path,
        priority: 0,
    }
}

/// An integer column shown by default.
pub(crate) const fn integer_column(name: &'static str, json_path: &'static str) -> Column {
    Column {
        name,
        type_: "integer",
        json_path,
        priority: 0,
    }
}

/// A string column shown only with `-o wide`.
pub(crate) const fn wide_column(name: &'static str, json_path: &'static str) -> Column {
    Column {
        name,
        type_: "string",
        json_path,
        priority: 1,
    }
}

/// The `.status.phase` summary column of kinds that keep Package Operator's phase field.
pub(crate) const PHASE_COLUMN: Column = Column {
    name: "Status",
    type_: "string",
    json_path: ".status.phase",
    priority: 0,
};

/// The `Age` column every kind shows last.
pub(crate) const AGE_COLUMN: Column = Column {
    name: "Age",
    type_: "date",
    json_path: ".metadata.creationTimestamp",
    priority: 0,
};

/// Declares a kind: the struct (metadata plus the given top-level fields plus an optional status), its
/// serde, `kube::Resource` and [`ApiKind`].
macro_rules! api_kind {
    (
        $(#[$meta:meta])*
        pub struct $kind:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $fty:ty, )*
        }
        $( status: $status:ty, )?
        scope: $scope:ident,
        info: $info:expr,
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        pub struct $kind {
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            $( $(#[$fmeta])* #[serde(default)] pub $field: $fty, )*
            $(
                /// Observed state, written by pko through the status subresource.
                #[serde(default)]
                pub status: Option<$status>,
            )?
        }

        impl serde::Serialize for $kind {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("apiVersion", <Self as kube::Resource>::api_version(&()).as_ref())?;
                map.serialize_entry("kind", <Self as kube::Resource>::kind(&()).as_ref())?;
                map.serialize_entry("metadata", &self.metadata)?;
                $( map.serialize_entry(stringify!($field), &self.$field)?; )*
                $(
                    let status: Option<&$status> = self.status.as_ref();
                    if let Some(status) = status {
                        map.serialize_entry("status", status)?;
                    }
                )?
                map.end()
            }
        }

        impl kube::Resource for $kind {
            type DynamicType = ();
            type Scope = k8s_openapi::$scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                <Self as $crate::core::resource::ApiKind>::INFO.kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                <Self as $crate::core::resource::ApiKind>::INFO.group.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $crate::VERSION.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                <Self as $crate::core::resource::ApiKind>::INFO.plural.into()
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }

        impl $crate::core::resource::ApiKind for $kind {
            const INFO: $crate::core::resource::KindInfo = $info;

            fn field_schemas() -> Vec<(&'static str, schemars::Schema)> {
                #[allow(unused_mut)]
                let mut fields = vec![$( (stringify!($field), $crate::core::resource::schema_for::<$fty>()), )*];
                $( fields.push(("status", $crate::core::resource::schema_for::<$status>())); )?
                fields
            }
        }
    };
}

pub(crate) use api_kind;
