//! String enums that keep values they do not know.
//!
//! Package Operator's enums (collisionProtection, lifecycleState, manifest scopes) are plain strings on the
//! wire. A typed Rust enum that failed on an unknown value would make one bad object break a whole list or
//! watch; instead an unknown value is kept as `Unknown(String)`, survives a round trip unchanged, and the
//! reconciler reports it as a condition naming the field. The CRD schema still lists only the known values.

/// Declares a string enum with known variants, an `Unknown(String)` catch-all, a default, serde and a schema
/// whose `enum` lists the known values.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident, default = $default:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version of pko does not know; kept verbatim.
            Unknown(String),
        }

        impl $name {
            /// Every known value, in declaration order.
            pub const KNOWN: &'static [&'static str] = &[$($value),+];

            /// The wire spelling.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $value, )+
                    Self::Unknown(other) => other.as_str(),
                }
            }

            /// Whether this is one of the known values.
            pub fn is_known(&self) -> bool {
                !matches!(self, Self::Unknown(_))
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::$default
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                match value {
                    $( $value => Self::$variant, )+
                    other => Self::Unknown(other.to_owned()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self::from(value.as_ref()))
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({
                    "type": "string",
                    "enum": [$($value),+],
                })
            }
        }
    };
}

pub(crate) use string_enum;
