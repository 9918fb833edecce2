module github.com/grovestore/grove

go 1.26.8
