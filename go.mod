module github.com/airlockhq/airlock

go 1.26.8

require golang.org/x/net v0.62.0

require (
	github.com/google/go-cmp v0.7.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
