from jaxpipe.digits.pretrain import main

main()
