{{- define "app.labels" }}
    app.kubernetes.io/name: {{ .package.metadata.name }}
{{- end }}
