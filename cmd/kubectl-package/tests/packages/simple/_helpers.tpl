{{- define "app.labels" }} {"app.kubernetes.io/name": {{ .package.metadata.name | quote }}}{{ end }}
{{- define "app.namespace" }}{{ .package.metadata.namespace | default (printf "%s-ns" .package.metadata.name) }}{{ end }}
